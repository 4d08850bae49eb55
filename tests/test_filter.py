"""Deterministic instance filtering: OLMo-core's repetition filter, the same flags as its own function, applied by
PackedDataset as a loss mask that leaves the stream alone, the same on every world size and worker count."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from detsampler.filter import RepetitionFilter, repetition_flags
from detsampler.layout import LayoutConfig
from detsampler.loader.dataset import PackedDataset, collate_micro_batch
from detsampler.loader.sampler import DeterministicBatchSampler
from detsampler.plan import Plan

olmo_utils = pytest.importorskip("olmo_core.data.utils")


def _olmo_flag(row: np.ndarray, config: RepetitionFilter, valid: np.ndarray | None = None) -> bool:
    """OLMo-core's ``_validate_instance`` negated, by its own ``find_periodic_sequences``; padding (``valid`` False)
    becomes a token of its own (a distinct negative value, never -1, its mask value)."""
    row = np.asarray(row, dtype=np.int64).copy()
    if valid is not None:
        row[~valid] = -2 - np.flatnonzero(~valid)
    return any(
        m.times >= config.max_count
        for m in olmo_utils.find_periodic_sequences(row, max_period=config.max_period, min_period=config.min_period)
    )


configs = st.builds(
    RepetitionFilter,
    max_period=st.integers(1, 9),
    min_period=st.just(1),
    max_count=st.integers(1, 12),
).filter(lambda c: c.min_period <= c.max_period) | st.builds(
    lambda lo, width, count: RepetitionFilter(max_period=lo + width, min_period=lo, max_count=count),
    st.integers(1, 6),
    st.integers(0, 4),
    st.integers(1, 10),
)


@st.composite
def rows(draw, length: int) -> np.ndarray:
    """Random tokens over a small vocabulary, with crafted periodic stretches written in (some just at the count)."""
    vocab = draw(st.integers(1, 6))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    row = rng.integers(0, vocab, size=length)
    for _ in range(draw(st.integers(0, 3))):
        period = draw(st.integers(1, 9))
        times = draw(st.integers(1, 14))
        start = draw(st.integers(0, length))
        unit = rng.integers(0, 40, size=period)
        piece = np.tile(unit, times + 1)[: period * times + draw(st.integers(-1, period))]
        row[start : start + len(piece)] = piece[: length - start]
    return row


@st.composite
def blocks(draw):
    length = draw(st.integers(1, 160))
    b = draw(st.integers(1, 6))
    block = np.stack([draw(rows(length)) for _ in range(b)])
    valid = None
    if draw(st.booleans()):  # padding at the tail of each row, as document/bestfit pad
        ends = draw(st.lists(st.integers(0, length), min_size=b, max_size=b))
        valid = np.arange(length)[None, :] < np.array(ends)[:, None]
    return block, valid


@settings(max_examples=300, deadline=None)
@given(blocks(), configs)
def test_flags_equal_olmo_core(block_valid, config):
    block, valid = block_valid
    got = repetition_flags(block, config, valid)
    want = [_olmo_flag(block[b], config, None if valid is None else valid[b]) for b in range(len(block))]
    assert got.tolist() == want
    if valid is not None:  # the tail padding given by its start instead
        assert repetition_flags(block, config, lengths=valid.sum(axis=1)).tolist() == want


def test_defaults_are_olmo_core():
    from olmo_core.data.numpy_dataset import InstanceFilterConfig

    ours, theirs = RepetitionFilter(), InstanceFilterConfig()
    assert (ours.max_period, ours.min_period, ours.max_count) == (
        theirs.repetition_max_period,
        theirs.repetition_min_period,
        theirs.repetition_max_count,
    )


def test_crafted_edges_by_value():
    f = RepetitionFilter(max_period=3, min_period=1, max_count=4)
    noise = np.arange(100, 140)
    assert not f.flags(noise[None])[0]
    exactly = noise.copy()
    exactly[10:22] = np.tile([7, 8, 9], 4)  # 4 repetitions of a period-3 unit: flagged
    one_short = noise.copy()
    one_short[10:21] = np.tile([7, 8, 9], 4)[:11]  # 3 and two thirds: not
    too_long_period = noise.copy()
    too_long_period[0:16] = np.tile([1, 2, 3, 4], 4)  # period 4 > max_period
    got = f.flags(np.stack([exactly, one_short, too_long_period]))
    assert got.tolist() == [True, False, False]
    pad = noise.copy()
    pad[20:] = 0  # a run of the pad id: flagged as tokens, not as padding
    assert f.flags(pad[None])[0] and not f.flags(pad[None], (np.arange(40) < 20)[None])[0]
    for bad in (dict(max_period=0), dict(min_period=5, max_period=4), dict(max_count=0), dict(max_count=True)):
        with pytest.raises(ValueError):
            RepetitionFilter(**bad)


FILTER = RepetitionFilter(max_period=4, min_period=1, max_count=3)  # flags some samples of the small corpus


@pytest.mark.parametrize("kind", ["concat", "bestfit"])
def test_flagged_labels_are_masked_and_nothing_else_changes(small_index, kind):
    layout = small_index.layout(LayoutConfig(kind=kind, seq_len=64, seed=1, window_docs=4))
    plain = PackedDataset(small_index, layout)
    filtered = PackedDataset(small_index, layout, instance_filter=FILTER, instance_mask=True)
    ids = np.arange(min(layout.num_samples, 400))
    a, b = plain.get_batch(ids), filtered.get_batch(ids)
    valid = a["document_ids"].numpy() >= 0 if kind != "concat" else None
    want = FILTER.flags(a["input_ids"].numpy(), valid)
    assert 0 < want.sum() < len(ids)  # the test exercises both kinds of sample
    assert b["instance_mask"].tolist() == (~want).tolist()
    for k in ("input_ids", "position_ids", "document_ids"):
        assert torch.equal(a[k], b[k])
    assert (b["labels"][want] == -100).all()
    assert torch.equal(b["labels"][~want], a["labels"][~want])
    assert set(PackedDataset(small_index, layout, instance_filter=FILTER).get_batch(ids)) == set(a)


def test_tokens_output_carries_the_mask(small_index):
    layout = small_index.layout(LayoutConfig(kind="concat", seq_len=64))
    ids = np.arange(200)
    fields = PackedDataset(small_index, layout, instance_filter=FILTER, instance_mask=True).get_batch(ids)
    tokens = PackedDataset(small_index, layout, output="tokens", instance_filter=FILTER).get_batch(ids)
    assert torch.equal(tokens["instance_mask"], fields["instance_mask"])
    with pytest.raises(ValueError, match="needs an instance_filter"):
        PackedDataset(small_index, layout, instance_mask=True)


def _masks_by_sample(ds, layout, world_size: int, num_workers: int, steps: int = 5) -> dict[int, bool]:
    plan = Plan(layout.num_samples, seed=3, global_batch_size=12, micro_batch_size=2, world_size=world_size)
    out: dict[int, bool] = {}
    for rank in range(world_size):
        sampler = DeterministicBatchSampler(plan, rank, start_step=0, stop_step=steps)
        loader = DataLoader(ds, batch_sampler=sampler, num_workers=num_workers, collate_fn=collate_micro_batch)
        for step, mbs in sampler.steps(loader):
            for micro, mb in enumerate(mbs):
                ids = plan.micro_batch(step, micro, rank)
                assert torch.equal(mb["labels"].eq(-100).all(1) | mb["instance_mask"], torch.ones(len(ids), dtype=bool))
                out.update(zip(np.asarray(ids).tolist(), mb["instance_mask"].tolist()))
    return out


def test_same_mask_on_every_world_size_and_worker_count(small_index):
    layout = small_index.layout(LayoutConfig(kind="bestfit", seq_len=64, seed=2, window_docs=4))
    ds = PackedDataset(small_index, layout, instance_filter=FILTER, instance_mask=True)
    runs = [_masks_by_sample(ds, layout, ws, nw) for ws, nw in ((1, 0), (3, 2), (2, 2))]
    assert runs[0] == runs[1] == runs[2] and len(runs[0]) == 60
    assert 0 < sum(not kept for kept in runs[0].values()) < 60


def test_stats_counts_what_the_filter_masks_by_value(capsys, cache_root, small_tokenizer, small_index):
    import json

    from detsampler.cli import main
    from detsampler.loader.dataset import instance_filter_counts

    base = ["--max-documents", "16", "--tokenizer", small_tokenizer.path, "--cache-dir", str(cache_root)]
    opts = ["--seq-len", "64", "--window-docs", "4", "--global-batch-size", "16", "--kinds", "concat,bestfit"]
    flt = ["--filter-steps", "2:12", "--instance-filter", "max_period=4,max_count=3"]
    assert main(["stats", *base, *opts, *flt, "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    for kind in ("concat", "bestfit"):
        layout = small_index.layout(LayoutConfig(kind=kind, seq_len=64, window_docs=4))
        plan = Plan(layout.num_samples, seed=0, global_batch_size=16, micro_batch_size=1, world_size=1)
        # the reference: the filtered dataset's own masks over the same samples
        ds = PackedDataset(small_index, layout, instance_filter=FILTER, instance_mask=True)
        plain = PackedDataset(small_index, layout)
        flagged = tokens = masked = samples = 0
        for step in range(2, 12):
            ids = plan.global_batch(step)
            kept = ds.get_batch(ids)["instance_mask"].numpy()
            loss = (plain.get_batch(ids)["labels"].numpy() != -100).sum(1)
            samples, flagged = samples + len(ids), flagged + int((~kept).sum())
            tokens, masked = tokens + int(loss.sum()), masked + int(loss[~kept].sum())
        row = stats["layouts"][kind]["instance_filter"]
        want = dict(samples=samples, flagged_samples=flagged, loss_tokens=tokens, flagged_loss_tokens=masked)
        assert {k: row[k] for k in want} == want and 0 < flagged < samples
        assert row == {**FILTER.to_dict(), "first_step": 2, "stop_step": 12, **want}
        assert instance_filter_counts(small_index, layout, plan, range(2, 12), FILTER) == {
            "first_step": 2,
            "stop_step": 12,
            **want,
        }
    assert main(["stats", *base, *opts, *flt]) == 0
    out = capsys.readouterr().out
    assert "concat: instance filter (max_period 4, min_period 1, max_count 3) over steps 2:12: " in out


@st.composite
def long_blocks(draw):
    """Rows of 2,048 tokens (the benchmark's) with many repeated pairs, so that the probe finds candidates."""
    b = draw(st.integers(1, 4))
    block = np.stack([draw(rows(2048)) for _ in range(b)])
    ends = draw(st.lists(st.integers(0, 2048), min_size=b, max_size=b))
    return block, np.array(ends)


@settings(max_examples=150, deadline=None)
@given(st.one_of(blocks(), long_blocks()), configs | st.just(RepetitionFilter()))
def test_flags_equal_the_former_implementation(block_valid, config):
    """The faster probe (issue 24 item 3) flags exactly what the former one did (tests/filter_reference.py), with
    padding given as a mask, as tail lengths, and not at all."""
    from tests.filter_reference import repetition_flags as reference

    block, valid = block_valid
    assert np.array_equal(repetition_flags(block, config), reference(block, config))
    if valid is None:
        return
    if valid.ndim == 1:  # tail lengths
        lengths, valid = valid, np.arange(block.shape[1])[None, :] < valid[:, None]
    else:
        lengths = valid.sum(axis=1)
    expected = reference(block, config, valid)
    assert np.array_equal(reference(block, config, lengths=lengths), expected)
    assert np.array_equal(repetition_flags(block, config, valid), expected)
    assert np.array_equal(repetition_flags(block, config, lengths=lengths), expected)
