"""Calibrating the balanced plan's cost model (detsampler.loader.calibrate): the compositions timed, the nonnegative
fit, and one real (tiny) calibration end to end; no timed assertion."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from detsampler.balance import CostModel
from detsampler.loader.calibrate import (
    CalibrationConfig,
    ReferenceModel,
    _fit,
    calibrate,
    compositions,
    main,
)


def test_compositions_halve_down_to_the_shortest_document():
    assert compositions(1024, 256) == [(1024,), (512, 512), (256, 256, 256, 256), (512, 256, 256)]
    assert all(sum(c) == 1000 for c in compositions(1000, 64))


def test_the_fit_recovers_exact_coefficients_and_never_goes_negative():
    squares = np.array([1e6, 4e6, 2.5e5, 9e6, 1e6, 3e6])
    tokens = np.array([1e3, 2e3, 1e3, 3e3, 2e3, 2e3])
    seconds = 2e-9 * squares + 5e-6 * tokens + 1e-3
    np.testing.assert_allclose(_fit(squares, tokens, seconds), [2e-9, 5e-6, 1e-3], rtol=1e-9)
    flat = 1e-5 * tokens  # no attention term at all: nothing negative is fitted for it
    a, b, c = _fit(squares, tokens, flat + np.array([1e-6, -1e-6, 1e-6, -1e-6, 1e-6, -1e-6]) * 1e-3)
    assert a >= 0 and b > 0 and c >= 0


def test_attention_is_masked_per_document():
    """The reference model's output for a document does not depend on the documents packed beside it."""
    torch.manual_seed(0)
    model = ReferenceModel(16, 2, 1)
    x = torch.randn(48, 16)
    together = model(x, [16, 32])
    alone = model(x[16:], [32])
    torch.testing.assert_close(together[16:], alone)


def test_a_tiny_calibration_returns_a_cost_model_in_units_of_linear_work(capsys):
    result = calibrate(CalibrationConfig(dim=16, n_heads=2, seq_lens=(256, 512), min_document=64, repeats=1))
    assert isinstance(result.cost, CostModel) and result.cost.linear in (0.0, 1.0)
    assert len(result.rows) == len(compositions(256, 64)) + len(compositions(512, 64))
    assert all(got > 0 for _, _, got, _ in result.rows)
    assert main(["--dim", "16", "--seq-lens", "256", "--repeats", "1"]) == 0
    assert "[data] balance = {attention = " in capsys.readouterr().out


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(dim=30, n_heads=4), r"CalibrationConfig.dim \(30\) must be divisible by n_heads \(4\)"),
        (dict(seq_lens=(128,)), r"seq_lens must be integers >= min_document \(256\), got \(128,\)"),
        (dict(kernel="dense"), r"kernel must be one of \('sdpa', 'flex'\), got 'dense'"),
        (dict(repeats=0), r"CalibrationConfig.repeats must be an integer >= 1, got 0"),
    ],
)
def test_bad_calibration_configs_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CalibrationConfig(**kwargs)
