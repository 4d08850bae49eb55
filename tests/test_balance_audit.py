"""A balanced plan through the audits: the data record rebuilds it, check_resume refuses a change of balance, and the
CLI's show, verify and where (with --balance and from a record) print what the library computes."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from detsampler import DataFingerprint, LayoutConfig, Plan, check_resume, locate
from detsampler.balance import Balance, CostModel
from detsampler.cli import main
from detsampler.index.locations import open_location
from detsampler.record import DataRecord
from detsampler.where import where
from tests.test_cli import _run, base_args  # noqa: F401  # base_args: a fixture

COST = CostModel(attention=0.5, linear=1.0, fixed=3.0)
OPTS = ["--kind", "bestfit", "--seq-len", "64", "--global-batch-size", "8", "--micro-batch-size", "2"]
OPTS += ["--world-size", "2", "--balance", "--balance-attention", "0.5", "--balance-fixed", "3"]


def _plan(layout, **kwargs) -> Plan:
    args = dict(seed=0, global_batch_size=8, micro_batch_size=2, world_size=2, balance=Balance(layout, COST)) | kwargs
    return Plan(layout.num_samples, **args)


def test_the_record_rebuilds_the_balanced_plan_and_a_resume_may_not_change_the_balance(small_index, tmp_path):
    layout = small_index.layout(LayoutConfig(kind="bestfit", seq_len=64))
    plan = _plan(layout)
    DataRecord.of(9, small_index, layout, plan, framework="test").save(tmp_path)
    loaded = DataRecord.load(tmp_path)
    assert loaded.fingerprint.plan["balance"] == {"algorithm": "lpt", "cost": COST.describe()}
    (reopened,) = [open_location(loc) for loc in loaded.indexes]
    again = reopened.layout(loaded.layout_configs()[0])
    rebuilt = loaded.plan(again.num_samples, layout=again, world_size=1, micro_batch_size=4)
    for step in range(9):
        np.testing.assert_array_equal(np.sort(rebuilt.global_batch(step)), np.sort(plan.global_batch(step)))
    np.testing.assert_array_equal(loaded.plan(again.num_samples, layout=again).global_batch(5), plan.global_batch(5))
    with pytest.raises(ValueError, match=r"the record's plan is balanced: its costs need the layout"):
        loaded.plan(again.num_samples)

    fp = lambda p: DataFingerprint.of(small_index, layout, p)
    check_resume(fp(plan), fp(plan.with_world(1, 4)), 9)  # another cut: the same data
    unbalanced = Plan(layout.num_samples, 0, 8, 2, 2)
    other_cost = _plan(layout, balance=Balance(layout, CostModel(attention=0.25)))
    for other in (unbalanced, other_cost):
        with pytest.raises(ValueError, match=r"resuming at step 9 changes the plan's balance from \{'algorithm'"):
            check_resume(fp(plan), fp(other), 9)
    with pytest.raises(ValueError, match=r"changes the plan's balance from None to \{'algorithm': 'lpt'"):
        check_resume(fp(unbalanced), fp(plan), 9)  # turned on at a resume: refused as well


def test_a_balanced_record_is_sealed_and_an_edited_balance_fails_the_seal(small_index, tmp_path):
    """Issue 31's seal covers the balance (in the fingerprint's plan) like every other field: an edited cost model is
    refused, re-sealed too (the fingerprint's hash); and a balanced resume keeps issue 32's redaction rules."""
    from detsampler.record import RECORD_SEAL, _seal
    from detsampler.redaction import Redaction

    layout = small_index.layout(LayoutConfig(kind="bestfit", seq_len=64))
    path = DataRecord.of(9, small_index, layout, _plan(layout), framework="test").save(tmp_path)
    saved = json.loads(path.read_text())
    assert saved[RECORD_SEAL] == _seal(saved) and saved["data_fingerprint"]["plan"]["balance"]["cost"]["attention"]
    saved["data_fingerprint"]["plan"]["balance"]["cost"]["attention"] = 0.25
    path.write_text(json.dumps(saved))
    with pytest.raises(ValueError, match=re.escape(f"{path}: the data record fails its seal ({RECORD_SEAL})")):
        DataRecord.load(tmp_path)
    path.write_text(json.dumps({**saved, RECORD_SEAL: _seal(saved)}))
    with pytest.raises(ValueError, match=r"the saved DataFingerprint's hash '\w+' does not match its content"):
        DataRecord.load(tmp_path)

    fp = lambda p: DataFingerprint.of(small_index, layout, p)
    redacted = _plan(layout, redactions=[Redaction([3], 12)])
    check_resume(fp(redacted), fp(_plan(layout, redactions=[Redaction([3], 10)])), 9)  # brought forward: allowed
    with pytest.raises(ValueError, match=r"resuming at step 9 drops"):
        check_resume(fp(redacted), fp(_plan(layout)), 9)


def test_show_verify_and_where_take_balance(capsys, base_args, small_index):
    layout = small_index.layout(LayoutConfig(kind="bestfit", seq_len=64))
    plan = _plan(layout)
    code, out, _ = _run(capsys, ["show", *base_args, *OPTS, "--step", "5", "--rank", "1", "--micro-step", "1"])
    assert code == 0
    for sid in locate(plan, layout, 5, rank=1, micro_step=1).sample_ids.tolist():
        assert f"sample {sid} " in out
    assert "balanced (LPT; cost = 0.5 * sum(len^2) + 1.0 * tokens + 3.0 per sample): rank costs max/mean 1.0" in out
    code, out, _ = _run(capsys, ["verify", *base_args, *OPTS, "--steps", "0:40"])
    assert code == 0 and "OK" in out
    code, out, _ = _run(capsys, ["where", *base_args, *OPTS, "--steps", "0:200", "--doc", "3", "--json"])
    assert code == 0 and json.loads(out)["reads"] == [r._asdict() for r in where(plan, layout, 3, range(200))]
    with pytest.raises(SystemExit) as exc:  # the CLI's errors exit 2 with the message
        main(["show", *base_args, *OPTS[:-5], "--balance-linear", "2", "--step", "1"])
    assert exc.value.code == 2 and "--balance-linear needs --balance" in capsys.readouterr().err
