"""``where``: document -> every (step, micro step, rank, row, span) that read it equals an exhaustive scan of ``locate``
over every step, for every layout kind, batch ramps, skip ranges, every mapping version (3: balanced) and mixtures with
schedules."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from detsampler.balance import Balance, CostModel
from detsampler.layout import LAYOUT_KINDS, LayoutConfig, make_layout
from detsampler.locate import locate
from detsampler.mixture import Mixture
from detsampler.plan import Plan
from detsampler.where import Read, document_samples, where
from tests.strategies import doc_lengths, seeds, skip_ranges, weight_schedules


def scan(plan, layout, doc, first, stop, source=None):
    """Every read of ``doc`` by steps ``[first, stop)``, by locating every (step, micro step, rank)."""
    out = []
    for s in range(first, stop):
        for a in range(plan.num_micro_steps(s)):
            for r in range(plan.world_size):
                loc = locate(plan, layout, s, rank=r, micro_step=a)
                for i in range(len(loc.sample_ids)):
                    if loc.sources is not None and int(loc.sources[i]) != source:
                        continue
                    offset = 0
                    for d, b, e in loc.spans.sample(i):
                        if d == doc:
                            sample = loc.sample_ids[i] if loc.sources is None else loc.source_sample_ids[i]
                            out.append(
                                Read(s, a, r, i, b, e, offset, int(loc.positions[i]), int(sample), int(loc.epochs[i]))
                            )
                        offset += e - b
    return sorted(out)


@st.composite
def layouts(draw):
    kind = draw(st.sampled_from(LAYOUT_KINDS))
    lengths = draw(doc_lengths(max_docs=25, max_len=40))
    seq_len = draw(st.integers(min_value=1 if kind == "concat" else 2, max_value=16))
    if kind == "concat" and lengths.sum() + len(lengths) <= seq_len:
        lengths = np.append(lengths, seq_len)
    window = draw(st.integers(min_value=1, max_value=8))
    config = LayoutConfig(kind=kind, seq_len=seq_len, seed=draw(seeds), window_docs=window)
    return make_layout(config, lengths)


@st.composite
def cuts(draw):
    """world_size, micro_batch_size, accumulation and a ramp (or None) over it."""
    world, micro = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    per = world * micro
    sizes = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
    starts = sorted(draw(st.sets(st.integers(1, 8), min_size=len(sizes) - 1, max_size=len(sizes) - 1)))
    ramp = [(s, per * k) for s, k in zip([0, *starts], sizes)] if len(sizes) > 1 else None
    return world, micro, per * sizes[-1], ramp


@given(
    layout=layouts(),
    cut=cuts(),
    seed=seeds,
    skips=st.one_of(st.none(), skip_ranges(max_step=12, max_ranges=2, max_len=3)),
    version=st.sampled_from([1, 2, 3]),
    data=st.data(),
)
def test_where_equals_the_scan(layout, cut, seed, skips, version, data):
    world, micro, batch, ramp = cut
    balance = Balance(layout, CostModel(attention=0.25)) if version == 3 else None
    plan = Plan(layout.num_samples, seed, batch, micro, world, ramp, skips, mapping_version=version, balance=balance)
    doc = data.draw(st.integers(0, layout.num_documents - 1), label="doc")
    first = data.draw(st.integers(0, 6), label="first")
    stop = first + data.draw(st.integers(0, 18), label="steps")
    assert where(plan, layout, doc, range(first, stop)) == scan(plan, layout, doc, first, stop)


@given(layout=layouts(), data=st.data())
def test_document_samples_are_the_samples_holding_the_document(layout, data):
    doc = data.draw(st.integers(0, layout.num_documents - 1), label="doc")
    found = document_samples(layout, doc)
    spans = layout.locate(np.arange(layout.num_samples))
    expect = []
    for c in range(layout.num_samples):
        offset = 0
        for d, b, e in spans.sample(c):
            if d == doc:
                expect.append((c, b, e, offset))
            offset += e - b
    got = list(zip(*(x.tolist() for x in (found.sample_ids, found.starts, found.stops, found.offsets))))
    assert got == expect


@given(
    lengths=st.lists(doc_lengths(max_docs=12, max_len=30), min_size=1, max_size=3),
    kind=st.sampled_from(LAYOUT_KINDS),
    mix_seed=seeds,
    skips=st.one_of(st.none(), skip_ranges(max_step=12, max_ranges=2, max_len=3)),
    version=st.sampled_from([1, 2, 3]),
    data=st.data(),
)
def test_where_through_a_mixture_equals_the_scan(lengths, kind, mix_seed, skips, version, data):
    config = LayoutConfig(kind=kind, seq_len=4, seed=1, window_docs=3)
    layouts = [make_layout(config, np.append(x, 9)) for x in lengths]
    schedule = data.draw(weight_schedules(len(layouts), max_step=10), label="weights")
    world, micro, batch, ramp = data.draw(cuts(), label="cut")
    mixture = Mixture(layouts, schedule, mix_seed)
    plan = Plan(
        source=mixture,
        global_batch_size=batch,
        micro_batch_size=micro,
        world_size=world,
        batch_size_schedule=ramp,
        skip_steps=skips,
        mapping_version=version,
        balance=Balance(layouts, CostModel(attention=1.0)) if version == 3 else None,
    )
    source = data.draw(st.integers(0, len(layouts) - 1), label="source")
    doc = data.draw(st.integers(0, layouts[source].num_documents - 1), label="doc")
    stop = data.draw(st.integers(0, 16), label="stop")
    got = where(plan, layouts, doc, range(0, stop), source=source)
    assert got == scan(plan, layouts, doc, 0, stop, source=source)


def test_global_positions_invert_the_routing():
    mixture = Mixture([5, 7, 300, 11], [(0, [1, 2, 3, 4]), (3, [0, 5, 1, 1]), (6, [2, 0, 0, 1])], seed=3)
    plan = Plan(source=mixture, global_batch_size=8, micro_batch_size=2, world_size=2)
    positions = np.arange(2000)
    sources, within = plan.stream._locate(positions)
    for k in range(4):
        sel = sources == k
        np.testing.assert_array_equal(plan.stream.global_positions(k, within[sel]), positions[sel])


def test_where_is_far_into_a_run_without_a_scan():
    lengths = np.random.default_rng(0).integers(0, 3000, size=10_000)
    layout = make_layout(LayoutConfig(kind="concat", seq_len=512, seed=3), lengths)
    plan = Plan(layout.num_samples, 7, 64, 4, 8)
    reads = where(plan, layout, 1234, range(10**6))
    # every epoch reads each of the document's samples once: reads per epoch = its samples
    per_epoch = len(document_samples(layout, 1234).sample_ids)
    epochs = 10**6 * 64 // layout.num_samples
    assert epochs * per_epoch <= len(reads) <= (epochs + 1) * per_epoch
    for r in reads[:3] + reads[-3:]:  # spot checks against locate
        loc = locate(plan, layout, r.step, rank=r.rank, micro_step=r.micro_step)
        assert (1234, r.start, r.stop) in loc.spans.sample(r.row)


def test_where_refuses_bad_arguments():
    layout = make_layout(LayoutConfig(kind="document", seq_len=4), np.array([3, 5, 9]))
    plan = Plan(layout.num_samples, 0, 2, 1, 2)
    with pytest.raises(ValueError, match="allowed documents"):
        where(plan, layout, 3, range(4))
    with pytest.raises(ValueError, match="source="):
        where(plan, layout, 0, range(4), source=0)
    with pytest.raises(ValueError, match="consecutive"):
        where(plan, layout, 0, range(0, 4, 2))


@pytest.mark.parametrize("kind", LAYOUT_KINDS)
def test_where_over_a_persisted_layout_equals_the_in_ram_layout(tmp_path, kind):
    from detsampler.index.synthetic import synthetic_index

    index = synthetic_index(tmp_path / "index", 300, mean_length=40, seed=5)
    config = LayoutConfig(kind=kind, seq_len=32, seed=4, window_docs=16)
    persisted = index.layout(config)
    in_ram = make_layout(config, np.asarray(index.lengths))
    plan = Plan(in_ram.num_samples, 9, 12, 2, 3, skip_steps=[(4, 6)])
    for doc in (0, 17, 299):
        assert where(plan, persisted, doc, range(200)) == where(plan, in_ram, doc, range(200))
    assert where(plan, persisted, 17, range(30)) == scan(plan, persisted, 17, 0, 30)


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("kind", LAYOUT_KINDS)
def test_where_equals_the_scan_above_the_small_domain(kind, version):
    """More than 1024 samples per epoch: the epochs' keyed Feistel network (not the small keyed shuffle) is inverted."""
    lengths = np.random.default_rng(1).integers(0, 200, size=1500)
    layout = make_layout(LayoutConfig(kind=kind, seq_len=64, seed=2, window_docs=100), lengths)
    assert layout.num_samples > 1024
    plan = Plan(layout.num_samples, 5, 128, 4, 4, [(0, 32), (10, 128)], [(20, 24)], mapping_version=version)
    stop = 3 * layout.num_samples // 128
    for doc in (0, 777, 1499):
        assert where(plan, layout, doc, range(stop)) == scan(plan, layout, doc, 0, stop)
