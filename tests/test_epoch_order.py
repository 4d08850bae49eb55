"""Issue 24 item 4: a new document order each epoch (``LayoutConfig(epoch_order=True)``, concat and document).

Each epoch reads every token of every document exactly once (concat: but that epoch's final partial sample), in its own
keyed order; the samples of two epochs are equal exactly when their orders agree on the documents the samples cover;
epoch 0 is the layout without the option; persisted epochs equal the in-RAM ones and stay bounded on disk; ``where``
equals the scan of ``locate`` across epoch boundaries (and through a mixture that upsamples an epoch-ordered source);
a resume mid-epoch 2 at another world size reads exactly what the run read; a resume with the option toggled is refused.
"""

from __future__ import annotations

import json
import pickle
import re
from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from detsampler.cli import main
from detsampler.epoch_order import document_order_key
from detsampler.index.layouts import PersistedEpochLayout, epoch_dirs, layout_dir
from detsampler.index.synthetic import write_lengths_index
from detsampler.layout import LayoutConfig, document_order, make_layout
from detsampler.loader.dataset import PackedDataset, collate_micro_batch
from detsampler.loader.mixture_dataset import MixtureDataset
from detsampler.loader.sampler import DeterministicBatchSampler
from detsampler.locate import locate
from detsampler.mixture import Mixture
from detsampler.plan import Plan
from detsampler.record import DataRecord
from detsampler.resume import DataFingerprint, check_resume
from detsampler.where import where
from tests.strategies import doc_lengths, seeds
from tests.test_where import scan

KINDS = ("concat", "document")


def _spans(layout, ids) -> list[list[tuple[int, int, int]]]:
    spans = layout.locate(np.asarray(ids, dtype=np.int64))
    return [spans.sample(i) for i in range(len(spans))]


def _epoch(layout, epoch: int) -> list[list[tuple[int, int, int]]]:
    n = layout.num_samples
    return _spans(layout, epoch * n + np.arange(n))


@st.composite
def corpora(draw, kind: str | None = None, max_docs: int = 30, max_len: int = 50):
    kind = kind or draw(st.sampled_from(KINDS))
    lengths = draw(doc_lengths(max_docs=max_docs, max_len=max_len))
    seq_len = draw(st.integers(1 if kind == "concat" else 2, 16))
    if kind == "concat" and lengths.sum() + len(lengths) <= seq_len:
        lengths = np.append(lengths, seq_len)
    return kind, lengths, seq_len, draw(seeds)


# -- the guarantee, per epoch ------------------------------------------------------------------------------------------


@given(corpus=corpora(), epoch=st.integers(0, 2**40))
@example(corpus=("concat", np.array([1]), 1, 0), epoch=1)
@example(corpus=("document", np.array([5, 0, 9]), 2, 3), epoch=7)
def test_each_epoch_reads_every_token_once_in_its_own_order(corpus, epoch):
    """The inputs of epoch ``e``'s samples, in sample order, are that epoch's stream (the documents in
    ``document_order(D, seed, e)``, each with its EOS) token for token: concat its first ``N * L`` positions, document
    every position (each document's pieces in its order)."""
    kind, lengths, seq_len, seed = corpus
    layout = make_layout(LayoutConfig(kind=kind, seq_len=seq_len, seed=seed, epoch_order=True), lengths)
    order = document_order(len(lengths), seed, epoch)
    assert sorted(order.tolist()) == list(range(len(lengths)))  # every document, once
    stream = [(int(d), p) for d in order for p in range(int(lengths[d]) + 1)]
    read = []
    for sample in _epoch(layout, epoch):
        positions = [(d, p) for d, a, b in sample for p in range(a, b)]
        assert len(positions) == layout.sample_len if kind == "concat" else 1 <= len(positions) <= seq_len
        read += positions[:seq_len]  # the inputs (concat: the last position is the next sample's first input)
    n = layout.num_samples
    assert read == (stream[: n * seq_len] if kind == "concat" else stream)
    assert layout.num_samples == make_layout(LayoutConfig(kind=kind, seq_len=seq_len, seed=seed), lengths).num_samples


@given(corpus=corpora(), epochs=st.lists(st.integers(0, 6), min_size=2, max_size=2, unique=True))
def test_two_epochs_differ_exactly_where_their_orders_differ(corpus, epochs):
    """Two epochs' samples are equal iff their orders agree on the documents the samples cover (all of them for
    document; concat: those that start before position ``N * L + 1``, the end of the last sample)."""
    kind, lengths, seq_len, seed = corpus
    layout = make_layout(LayoutConfig(kind=kind, seq_len=seq_len, seed=seed, epoch_order=True), lengths)
    a, b = (document_order(len(lengths), seed, e) for e in epochs)
    if kind == "concat":
        starts = np.concatenate([[0], np.cumsum(lengths[a] + 1)[:-1]])  # the same prefix wherever the orders agree
        covered = int(np.searchsorted(starts, layout.num_samples * seq_len + 1))
        agree = bool(np.array_equal(a[:covered], b[:covered]))
    else:
        agree = bool(np.array_equal(a, b))
    assert (_epoch(layout, epochs[0]) == _epoch(layout, epochs[1])) == agree


def test_epoch_zero_is_the_layout_without_the_option_and_later_epochs_move_the_boundaries():
    lengths = np.array([7, 3, 12, 0, 5, 9, 1, 4], dtype=np.int64)
    for kind in KINDS:
        plain = make_layout(LayoutConfig(kind=kind, seq_len=4, seed=5), lengths)
        layout = make_layout(LayoutConfig(kind=kind, seq_len=4, seed=5, epoch_order=True), lengths)
        assert _epoch(layout, 0) == _spans(plain, np.arange(plain.num_samples))
        assert plain.describe() | {"epoch_order": True} == layout.describe()
        epochs = [_epoch(layout, e) for e in range(4)]
        starts = [frozenset(sample[0][:2] for sample in samples) for samples in epochs]  # (document, position)
        if kind == "concat":  # the samples start at other places in each epoch
            assert len(set(starts)) == 4
        else:  # a document sample is a piece from a document's start: the same pieces, named by other ids
            assert len(set(starts)) == 1 and len({tuple(map(tuple, samples)) for samples in epochs}) == 4


def test_pinned_epoch_orders():
    """The mapping users rely on across versions: epoch orders of a fixed corpus, and their keys."""
    assert document_order_key(5, 0) == document_order_key(5) != document_order_key(5, 1)
    assert document_order(8, 5, 0).tolist() == document_order(8, 5).tolist()
    assert document_order(8, 5, 1).tolist() == PINNED_EPOCH_1
    assert document_order(8, 5, 2).tolist() == PINNED_EPOCH_2
    lengths = np.array([7, 3, 12, 0, 5, 9, 1, 4], dtype=np.int64)
    layout = make_layout(LayoutConfig(kind="concat", seq_len=4, seed=5, epoch_order=True), lengths)
    assert _spans(layout, [1, layout.num_samples + 1, 2 * layout.num_samples + 1]) == PINNED_SAMPLE_1


PINNED_EPOCH_1 = [3, 4, 5, 2, 7, 0, 1, 6]  # epoch 0: [4, 3, 6, 1, 5, 2, 7, 0]
PINNED_EPOCH_2 = [0, 6, 1, 7, 3, 5, 2, 4]
PINNED_SAMPLE_1 = [[(4, 4, 6), (3, 0, 1), (6, 0, 2)], [(4, 3, 6), (5, 0, 2)], [(0, 4, 8), (6, 0, 1)]]


def test_config_validation():
    with pytest.raises(ValueError, match="epoch_order applies to the concat and document layouts"):
        LayoutConfig(kind="bestfit", epoch_order=True)
    with pytest.raises(ValueError, match="epoch_order must be True or False, got 1"):
        LayoutConfig(epoch_order=1)
    layout = make_layout(LayoutConfig(seq_len=4, epoch_order=True), np.array([9, 9, 9]))
    with pytest.raises(ValueError, match=r"Got sample id -1, allowed sample ids .* epoch \* 7 \+ sample"):
        layout.locate(np.array([3, -1]))
    with pytest.raises(ValueError, match="epoch_ids=True"):  # a plan whose ids carry no epoch
        locate(Plan(layout.num_samples, global_batch_size=1, micro_batch_size=1), layout, 0)
    plain = make_layout(LayoutConfig(seq_len=4), np.array([9, 9, 9]))
    with pytest.raises(ValueError, match="epoch_ids=False"):
        locate(Plan(plain.num_samples, global_batch_size=1, micro_batch_size=1, epoch_ids=True), plain, 0)


# -- the plan's ids, where, show ---------------------------------------------------------------------------------------


@given(
    corpus=corpora(max_docs=12, max_len=20),
    world=st.integers(1, 3),
    micro=st.integers(1, 2),
    seed=seeds,
    data=st.data(),
)
def test_where_equals_the_scan_across_epochs(corpus, world, micro, seed, data):
    kind, lengths, seq_len, layout_seed = corpus
    layout = make_layout(LayoutConfig(kind=kind, seq_len=seq_len, seed=layout_seed, epoch_order=True), lengths)
    batch = world * micro * data.draw(st.integers(1, 2), label="accumulation")
    plan = Plan(layout.num_samples, seed, batch, micro, world, epoch_ids=True)
    past_epoch_0 = layout.num_samples // batch + 1  # a step of epoch 1 (or one straddling epochs 0 and 1) is in
    stop = data.draw(st.integers(past_epoch_0, 3 * layout.num_samples // batch + 2), label="stop")  # 2 to 3 epochs
    first = data.draw(st.integers(0, past_epoch_0 - 1), label="first")
    doc = data.draw(st.integers(0, len(lengths) - 1), label="doc")
    got = where(plan, layout, doc, range(first, stop))
    assert got == scan(plan, layout, doc, first, stop)
    assert {r.sample_id // layout.num_samples for r in got} == {r.epoch for r in got}  # ids carry their epoch


@pytest.mark.parametrize("kind", KINDS)
def test_where_equals_the_scan_for_every_document_over_three_epochs(kind):
    lengths = np.random.default_rng(8).integers(0, 30, size=20)
    layout = make_layout(LayoutConfig(kind=kind, seq_len=8, seed=4, epoch_order=True), lengths)
    plan = Plan(layout.num_samples, 5, 6, 1, 2, [(0, 2), (5, 6)], [(7, 8)], epoch_ids=True)  # a ramp, a skip range
    stop = 3 * layout.num_samples // 6 + 2
    epochs = set()
    for doc in range(len(lengths)):
        got = where(plan, layout, doc, range(stop))
        assert got == scan(plan, layout, doc, 0, stop)
        epochs |= {r.epoch for r in got}
    assert epochs == {0, 1, 2, 3}


def test_where_through_a_mixture_that_upsamples_an_epoch_ordered_source():
    small = make_layout(LayoutConfig(seq_len=4, seed=1, epoch_order=True), np.array([5, 2, 8, 3, 6]))
    big = make_layout(LayoutConfig(kind="document", seq_len=4, seed=2), np.arange(40) % 9)
    mixture = Mixture([small, big], [1, 1], seed=3)
    plan = Plan(source=mixture, global_batch_size=4, micro_batch_size=2, world_size=2)
    stop = 4 * small.num_samples // 2  # source 0 runs about four epochs
    for doc in range(5):
        got = where(plan, [small, big], doc, range(stop), source=0)
        assert got == scan(plan, [small, big], doc, 0, stop, source=0)
        assert len({r.epoch for r in got}) >= 3
    look = mixture.with_step_positions(plan.data_consumed).lookup(np.arange(4 * stop))
    source, sample = mixture.split_ids(look.global_id)
    np.testing.assert_array_equal(source, look.source)
    np.testing.assert_array_equal(sample, look.source_sample)  # the source's ids carry its epoch, the other's do not
    assert (look.source_sample[look.source == 1] < big.num_samples).all()
    assert (look.source_sample[look.source == 0] // small.num_samples == look.source_epoch[look.source == 0]).all()


def test_show_and_where_follow_the_epoch(capsys, cache_root, small_tokenizer, small_index):
    """``detsampler show`` of a step in epoch 2 prints what ``locate`` gives; ``where --json`` what ``where`` gives."""
    layout = small_index.layout(LayoutConfig(kind="concat", seq_len=32, seed=2, epoch_order=True))
    plan = Plan(layout.num_samples, seed=1, global_batch_size=8, micro_batch_size=4, epoch_ids=True)
    step = 2 * layout.num_samples // 8 + 1
    argv = ["--max-documents", "16", "--tokenizer", small_tokenizer.path, "--cache-dir", str(cache_root)]
    argv += ["--seq-len", "32", "--layout-seed", "2", "--seed", "1", "--global-batch-size", "8"]
    argv += ["--micro-batch-size", "4", "--epoch-order"]
    assert main(["show", *argv, "--step", str(step)]) == 0
    shown = capsys.readouterr().out
    loc = locate(plan, layout, step)
    assert f"step {step}: sample hash" in shown and "epoch 2," in shown
    for i in range(len(loc.sample_ids)):
        head = f"position {int(loc.positions[i])}  sample {int(loc.sample_ids[i])}  epoch {int(loc.epochs[i])}  "
        assert head in shown
    docs = [line.split()[1] for line in shown.splitlines() if line.startswith("    doc ")]
    assert docs == [str(d) for d in loc.spans.doc_ids.tolist()]
    doc = int(loc.spans.doc_ids[0])
    assert main(["where", *argv, "--doc", str(doc), "--steps", f"0:{step + 1}", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["layout"]["epoch_order"] is True
    assert [tuple(r.values()) for r in found["reads"]] == [tuple(r) for r in where(plan, layout, doc, (0, step + 1))]
    assert {r["epoch"] for r in found["reads"]} == {0, 1, 2}


# -- persisted epochs --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_persisted_epochs_equal_the_in_ram_ones_and_stay_bounded(tmp_path, kind):
    lengths = np.random.default_rng(1).integers(0, 60, size=300)
    index = write_lengths_index(tmp_path, [lengths], len(lengths), {"test": "epoch-order", "kind": kind})
    config = LayoutConfig(kind=kind, seq_len=16, seed=9, epoch_order=True)
    layout, ram = index.layout(config), make_layout(config, lengths)
    assert isinstance(layout, PersistedEpochLayout) and layout.path == layout_dir(
        index, replace(config, epoch_order=False)
    )
    assert layout.describe() == ram.describe()
    n = layout.num_samples
    for epoch in range(6):
        ids = epoch * n + np.random.default_rng(epoch).integers(0, n, size=50)
        assert _spans(layout, ids) == _spans(ram, ids)
        layout.wait_ahead()  # the next epoch was built in the background when this one was opened
        assert (layout_dir(index, config, epoch + 1) / "layout.json").is_file()
        assert set(epoch_dirs(index, config)) <= {epoch - 1, epoch, epoch + 1} - {0}
    again = pickle.loads(pickle.dumps(layout))  # a DataLoader worker: reopens, nothing of size D copied
    ids = np.array([0, n + 3, 5 * n + 7, 2 * n - 1])  # epochs 0, 1 (removed: built again), 5, 1
    assert _spans(again, ids) == _spans(ram, ids)


def test_resume_mid_epoch_2_at_another_world_size_is_exact(small_index):
    """Through the DataLoader (2 workers: the layout pickled and reopened) and the packed dataset: the batches of a run
    at world size 2 resumed mid-step in epoch 2 at world size 1 with another micro batch equal the uninterrupted
    run's, token for token."""
    config = LayoutConfig(kind="document", seq_len=64, seed=3, epoch_order=True)
    layout = small_index.layout(config)
    dataset = PackedDataset(small_index, layout)
    plan = Plan(layout.num_samples, seed=4, global_batch_size=8, micro_batch_size=2, world_size=2, epoch_ids=True)
    step = 2 * layout.num_samples // 8 + 1
    assert plan.epoch(step) == 2 and plan.epoch(step + 3) in (2, 3)

    def run(plan, start, state=None, num_workers=0):
        out = []
        for rank in range(plan.world_size):
            sampler = DeterministicBatchSampler(plan, rank, start_step=start, stop_step=step + 4)
            if state is not None:
                sampler.load_state_dict(state)
            loader = DataLoader(dataset, batch_sampler=sampler, num_workers=num_workers, collate_fn=collate_micro_batch)
            out.append([b["input_ids"] for b in loader])
        return out

    whole = run(plan, step)  # per rank: micro batches of steps step..step+3, 2 per step
    resumed = run(plan.with_world(1, 4), step, {"step": step, "samples_in_step": 4}, num_workers=2)[0]
    steps = [torch.cat([whole[r][2 * s + a] for a in range(2) for r in range(2)]) for s in range(4)]  # position order
    assert torch.equal(torch.cat(resumed), torch.cat([steps[0][4:], *steps[1:]]))


def test_a_resume_with_the_option_toggled_is_refused(tmp_path):
    lengths = np.random.default_rng(2).integers(0, 30, size=50)
    index = write_lengths_index(tmp_path, [lengths], len(lengths), {"test": "epoch-order-resume"})
    fingerprints = []
    for on in (False, True):
        layout = index.layout(LayoutConfig(kind="concat", seq_len=8, epoch_order=on))
        plan = Plan(layout.num_samples, global_batch_size=4, micro_batch_size=2, epoch_ids=on)
        fingerprints.append(DataFingerprint.of(index, layout, plan))
    off, on = fingerprints
    assert "epoch_order" not in off.layout and "epoch_ids" not in off.plan["stream"]
    for old, new, change in ((off, on, "'<absent>' -> True"), (on, off, "True -> '<absent>'")):
        with pytest.raises(ValueError, match=re.escape(f"changes the layout: layout.epoch_order: {change}")):
            check_resume(old, new, 3)
    check_resume(on, DataFingerprint.from_dict(json.loads(json.dumps(on.to_dict()))), 3)
    record = DataRecord.from_json(DataRecord.of(3, index, layout, plan).to_json())  # what a checkpoint saves
    assert record.layout_configs() == [layout.config] and record.plan(layout.num_samples).stream.epoch_ids


def test_a_mixture_dataset_serves_an_epoch_ordered_source_by_its_epoch(small_index):
    config = LayoutConfig(kind="concat", seq_len=32, seed=6, epoch_order=True)
    layout = small_index.layout(config)
    other = small_index.layout(LayoutConfig(kind="document", seq_len=32, seed=6))
    mixture = Mixture([layout, other], [3, 1], seed=0)
    datasets = [PackedDataset(small_index, layout), PackedDataset(small_index, other)]
    plan = Plan(source=mixture, global_batch_size=8, micro_batch_size=8)
    mixed = MixtureDataset(datasets, mixture)
    step = 2 * layout.num_samples // 6
    loc = locate(plan, [layout, other], step)
    batch = mixed.__getitems__(plan.global_batch(step).tolist()).batch
    for i in range(len(loc.sample_ids)):
        k = int(loc.sources[i])
        want = datasets[k].get_batch([int(loc.source_sample_ids[i])])["input_ids"][0]
        assert torch.equal(batch["input_ids"][i], want)
    assert (loc.epochs[loc.sources == 0] >= 1).any()


def test_verify_reads_every_sample_once_per_epoch_with_ids_that_carry_it():
    from detsampler.verify import verify_mixture_plan, verify_plan

    layout = make_layout(LayoutConfig(seq_len=4, seed=1, epoch_order=True), np.array([5, 2, 8, 3, 6, 11]))
    plan = Plan(layout.num_samples, seed=2, global_batch_size=3, micro_batch_size=1, world_size=3, epoch_ids=True)
    stop = 3 * layout.num_samples // 3 + 1
    report = verify_plan(plan, 0, stop)
    assert report["ok"] and [row["epoch"] for row in report["epochs"]] == [0, 1, 2, 3]
    other = make_layout(LayoutConfig(kind="document", seq_len=4, seed=2), np.arange(30) % 7)
    mixed = Plan(source=Mixture([layout, other], [1, 1], seed=3), global_batch_size=4, micro_batch_size=2)
    report = verify_mixture_plan(mixed, 0, 3 * layout.num_samples // 2)
    assert report["ok"] and len(report["sources"][0]["epochs"]) >= 3


def test_the_trainer_config_maps_the_option_onto_the_layout_and_the_plan():
    from pathlib import Path

    from train.config import load_config
    from train.data import _layout_config, _plan

    tiny = Path(__file__).resolve().parent.parent / "train" / "configs" / "tiny.toml"
    config = load_config(tiny, ["data.epoch_order=true"]).data
    assert config.epoch_order and _layout_config(config).epoch_order
    assert _plan(config, 2, num_samples=100).stream.epoch_ids
    assert not _plan(load_config(tiny).data, 2, num_samples=100).stream.epoch_ids
    with pytest.raises(ValueError, match="DataConfig: epoch_order applies to the concat and document layouts"):
        load_config(tiny, ["data.epoch_order=true", 'data.layout="bestfit"'])
