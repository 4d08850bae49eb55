"""Mixtures: the discrepancy bound, exact source epochs, weight schedules, bad input, DataLoader and elastic resume."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detsampler import Mixture, Plan
from detsampler.keys import subkeys
from detsampler.mixture import MAX_DENOMINATOR, MixtureConfig, normalize_weights
from detsampler.permutation import permute
from detsampler.resume import DataFingerprint
from detsampler.resume import check_resume as check_fingerprints
from tests.strategies import integer_weights, seeds, weight_schedules


def check_resume(old, new, resume_step):
    """The library's check over two fingerprints that differ only in their plans (one index, one layout)."""

    def fp(plan):
        return DataFingerprint("index", {"kind": "concat"}, plan if isinstance(plan, dict) else plan.fingerprint())

    check_fingerprints(fp(old), fp(new), resume_step)


def _prefix_counts(sources: np.ndarray, num_sources: int) -> np.ndarray:
    """counts[k, n] = how many of positions [0, n) went to source k."""
    onehot = sources[None, :] == np.arange(num_sources)[:, None]
    return np.concatenate([np.zeros((num_sources, 1), dtype=np.int64), np.cumsum(onehot, axis=1)], axis=1)


def _assert_within_bound(mix: Mixture, counts: np.ndarray, lengths: np.ndarray, segment: int = 0) -> None:
    """|N_k(n) - n c_k / D| < b_k exactly, in integers: |N_k(n) D - n c_k| * q_k < p_k D with b_k = p_k / q_k."""
    ints = mix.schedule[segment][1]
    total = sum(ints)
    for k, bound in enumerate(mix.discrepancy_bounds(segment)):
        err = np.abs(counts[k] * total - lengths * ints[k])
        if ints[k] == 0:
            assert not counts[k].any()
        elif bound == 0:  # the only source of positive weight: exact
            assert not err.any()
        else:
            assert (err * bound.denominator < bound.numerator * total).all(), (k, bound, int(err.max()), total)


# -- property 1: the discrepancy bound
# -----------------------------------------------------------------------------------


@given(weights=integer_weights(), seed=seeds, n=st.integers(1, 3000), big=st.integers(0, 2**52))
def test_prefix_counts_stay_within_the_bound(weights, seed, n, big):
    mix = Mixture([7] * len(weights), weights, seed)
    counts = _prefix_counts(mix.sources_of(np.arange(n)), len(weights))
    _assert_within_bound(mix, counts, np.arange(n + 1))
    # The closed form agrees with counting, and the bound holds for arbitrary (huge) prefixes too.
    assert (mix.served(n) == counts[:, -1]).all()
    _assert_within_bound(mix, mix.served(big)[:, None], np.array([big]))
    # The stated corollary: every per-source bound is at most ceil(log2 m), m = number of sources of positive weight.
    m = sum(1 for w in weights if w)
    assert all(b <= max(0, math.ceil(math.log2(m))) for b in mix.discrepancy_bounds())


def test_two_sources_are_within_one_and_interleaved():
    mix = Mixture([100, 100], [3, 1], seed=5)
    src = mix.sources_of(np.arange(400))
    counts = _prefix_counts(src, 2)
    assert np.abs(4 * counts[1] - np.arange(401)).max() < 4  # |N_1(n) - n/4| < 1
    runs = np.diff(np.flatnonzero(src == 1))
    assert set(runs.tolist()) == {4}  # source 1 once every 4 positions, never two in a row
    assert mix.discrepancy_bounds() == [Fraction(1), Fraction(1)]


def test_interleaving_order_depends_on_the_seed():
    patterns = {tuple(Mixture([50] * 4, [1, 2, 3, 4], seed=s).sources_of(np.arange(10)).tolist()) for s in range(12)}
    assert len(patterns) > 3


@given(
    weights=st.lists(st.just(0.0) | st.floats(1e-2, 1e3), min_size=1, max_size=5).filter(any),
    seed=seeds,
)
def test_float_weights_are_read_exactly_or_within_two_to_minus_30(weights, seed):
    ints = normalize_weights(weights, len(weights))
    assert sum(ints) <= MAX_DENOMINATOR
    total = sum(Fraction(repr(w)) for w in weights)
    for w, c in zip(weights, ints):
        assert abs(Fraction(c, sum(ints)) - Fraction(repr(w)) / total) <= Fraction(1, MAX_DENOMINATOR)
    mix = Mixture([11] * len(weights), weights, seed)
    counts = _prefix_counts(mix.sources_of(np.arange(500)), len(weights))
    _assert_within_bound(mix, counts, np.arange(501))


def test_decimal_and_fraction_weights_are_exact():
    assert normalize_weights([0.7, 0.2, 0.1], 3) == (7, 2, 1)
    assert normalize_weights(["1/3", "1/3", "1/3"], 3) == (1, 1, 1)
    assert normalize_weights([Fraction(1, 6), 0.5, 2], 3) == (1, 3, 12)
    assert Mixture([5, 5], [0.25, 0.75], 0).describe()["schedule"] == [[0, ["1/4", "3/4"]]]


# -- property 2: every source epoch is a permutation of the source ----------------------------------------------------


@given(
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=4),
    data=st.data(),
    seed=seeds,
    n=st.integers(1, 1500),
)
def test_each_source_epoch_serves_every_sample_once(sizes, data, seed, n):
    weights = data.draw(integer_weights(len(sizes)))
    mix = Mixture(sizes, weights, seed)
    look = mix.lookup(np.arange(n))
    offsets = np.cumsum([0] + sizes[:-1])
    assert (look.global_id == offsets[look.source] + look.source_sample).all()
    src, sample = mix.split_ids(look.global_id)
    assert (src == look.source).all() and (sample == look.source_sample).all()
    assert (mix.sample_ids(np.arange(n)) == look.global_id).all()
    assert (mix.epochs(np.arange(n)) == look.source_epoch).all()
    for k, size in enumerate(sizes):
        mine = look.source == k
        # p_k counts exactly the earlier positions of source k: 0, 1, 2, ... in order.
        assert (look.source_position[mine] == np.arange(mine.sum())).all()
        assert (look.source_epoch[mine] == look.source_position[mine] // size).all()
        for e in np.unique(look.source_epoch[mine]):
            served = np.sort(look.source_sample[mine & (look.source_epoch == e)])
            complete = (e + 1) * size <= mine.sum()
            if complete:
                assert (served == np.arange(size)).all()
            else:
                assert len(np.unique(served)) == len(served) and served.max() < size
            # and the order is source k's own keyed permutation of that epoch
            expected = permute(np.arange(len(served)), size, int(subkeys(mix.source_key(k), int(e))))
            assert (look.source_sample[mine & (look.source_epoch == e)] == expected).all()


def test_a_small_source_is_upsampled_by_epochs_and_reported():
    mix = Mixture([10, 1000], [1, 1], seed=0)
    report = mix.report(200)
    assert report[0]["served"] == 100 and report[0]["epochs"] == 10.0 and report[0]["upsampled"]
    assert report[1]["served"] == 100 and not report[1]["upsampled"]
    assert report[0]["share"] == 0.5


# -- property 3: weight schedules
# ----------------------------------------------------------------------------------------


@given(sizes=st.lists(st.integers(1, 30), min_size=2, max_size=4), data=st.data(), seed=seeds)
def test_schedule_boundaries_neither_repeat_nor_skip_positions(sizes, data, seed):
    schedule = data.draw(weight_schedules(len(sizes)))
    # a source added at a boundary: weight 0 in the first entry
    schedule[0] = (0, [0] + list(schedule[0][1][1:]) if any(schedule[0][1][1:]) else schedule[0][1])
    plan = Plan(
        source=Mixture(sizes, schedule, seed),
        seed=seed,
        global_batch_size=6,
        micro_batch_size=3,
        batch_size_schedule=[(0, 3), (4, 6)],
    )
    num_steps = schedule[-1][0] + 5
    positions = np.arange(plan.consumed(num_steps))
    look = plan.stream.lookup(positions)
    for k in range(len(sizes)):
        mine = look.source == k
        assert (look.source_position[mine] == np.arange(mine.sum())).all()
    for step, ints in schedule:  # each segment follows its own weights, within its bound
        j = [s for s, _ in schedule].index(step)
        lo = plan.consumed(step)
        hi = plan.consumed(schedule[j + 1][0]) if j + 1 < len(schedule) else len(positions)
        seg = look.source[lo:hi]
        _assert_within_bound(plan.stream, _prefix_counts(seg, len(sizes)), np.arange(hi - lo + 1), segment=j)
        assert (plan.stream.served(hi) - plan.stream.served(lo) == np.bincount(seg, minlength=len(sizes))).all()


@given(
    sizes=st.lists(st.integers(1, 30), min_size=2, max_size=3),
    data=st.data(),
    seed=seeds,
    resume=st.integers(1, 10),
    world=st.sampled_from([(1, 4), (2, 2), (4, 1), (4, 2), (1, 8)]),
)
def test_a_resume_with_a_new_schedule_entry_equals_the_uninterrupted_run(sizes, data, seed, resume, world):
    w0, w1 = data.draw(integer_weights(len(sizes))), data.draw(integer_weights(len(sizes)))
    full = [(0, w0), (resume, w1)]
    uninterrupted = Plan(
        source=Mixture(sizes, full, seed), seed=seed, global_batch_size=8, micro_batch_size=2, world_size=2
    )
    first = Plan(source=Mixture(sizes, w0, seed), seed=seed, global_batch_size=8, micro_batch_size=2, world_size=2)
    resumed = uninterrupted.with_world(*world)
    check_resume(first, resumed, resume)
    check_resume(first.fingerprint(), resumed, resume)  # also from a saved fingerprint
    stitched = [first.global_batch(s) for s in range(resume)] + [
        resumed.global_batch(s) for s in range(resume, resume + 6)
    ]
    straight = [uninterrupted.global_batch(s) for s in range(resume + 6)]
    for a, b in zip(stitched, straight):
        assert (np.sort(a) == np.sort(b)).all()
    # the same change written before the resume step changes the past: refused
    if resume > 1:
        early = Plan(
            source=Mixture(sizes, [(0, w0), (resume - 1, w1)], seed), seed=seed, global_batch_size=8, micro_batch_size=2
        )
        with pytest.raises(ValueError, match="changes the past"):
            check_resume(first, early, resume)
    if normalize_weights(w0, len(sizes)) != normalize_weights(w1, len(sizes)):
        with pytest.raises(ValueError, match="changes the past"):
            check_resume(
                first, Plan(source=Mixture(sizes, w1, seed), seed=seed, global_batch_size=8, micro_batch_size=2), resume
            )


def test_check_resume_refuses_other_changes():
    base = Plan(source=Mixture([10, 20], [1, 1], 3), seed=0, global_batch_size=4, micro_batch_size=2)
    with pytest.raises(ValueError, match="mixture's seed"):
        check_resume(
            base, Plan(source=Mixture([10, 20], [1, 1], 4), seed=0, global_batch_size=4, micro_batch_size=2), 5
        )
    with pytest.raises(ValueError, match="mixture's sources"):
        check_resume(
            base, Plan(source=Mixture([10, 21], [1, 1], 3), seed=0, global_batch_size=4, micro_batch_size=2), 5
        )
    with pytest.raises(ValueError, match="batch_size_schedule"):
        check_resume(
            base, Plan(source=Mixture([10, 20], [1, 1], 3), seed=0, global_batch_size=8, micro_batch_size=2), 5
        )
    with pytest.raises(ValueError, match="data stream"):
        check_resume(base, Plan(30, seed=0, global_batch_size=4, micro_batch_size=2), 5)
    check_resume(base, base.with_world(2, 1), 5)  # elastic resume is fine
    check_resume(
        base,
        Plan(source=Mixture([10, 20], [(0, [1, 1]), (5, [1, 3])], 3), seed=0, global_batch_size=4, micro_batch_size=2),
        5,
    )  # an entry at the resume step
    check_resume(
        base,
        Plan(source=Mixture([10, 20], [(0, [2, 2]), (5, [1, 3])], 3), seed=0, global_batch_size=4, micro_batch_size=2),
        5,
    )  # same weights, other scale


# -- bad input
# -----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("weights", "match"),
    [
        ([1, -1], r"weights\[1\] must be >= 0"),
        ([0, 0], "must not all be zero"),
        ([1, 2, 3], "one weight per source"),
        ([1, float("nan")], "must be finite"),
        ([1, float("inf")], "must be finite"),
        ([1, "x"], "must be a number"),
        ([1, None], "must be a number"),
        ([(0, [1, 1]), (0, [1, 2])], "strictly increasing"),
        ([(0, [1, 1]), (5, [1, 2]), (3, [1, 1])], "strictly increasing"),
        ([(2, [1, 1])], "must start at step 0"),
        ([(0, [1, 1]), (4, [1, -2])], r"entry 1 \(step 4\)\[1\] must be >= 0"),
        ([(0, [1, 1]), (4, [1])], "one weight per source"),
        ([(0, [1, 1]), (-1, [1, 1])], "integer >= 0"),
    ],
)
def test_bad_weights_are_clear_errors(weights, match):
    with pytest.raises(ValueError, match=match):
        Mixture([10, 20], weights, seed=0)


def test_bad_sources_and_unplaced_schedules_are_clear_errors():
    with pytest.raises(ValueError, match="sources must be a non-empty list"):
        Mixture([], [], 0)
    with pytest.raises(ValueError, match=r"sources\[1\] must have num_samples >= 1"):
        Mixture([3, 0], [1, 1], 0)
    with pytest.raises(ValueError, match="use it through a Plan"):
        Mixture([3, 4], [(0, [1, 1]), (3, [1, 2])], 0).sample_ids(np.arange(3))
    with pytest.raises(ValueError, match="too small to be served"):
        Mixture([3, 4], [1, 1e-12], 0)


# -- property 5: elastic resume and DataLoader workers
# ------------------------------------------------------------------

torch = pytest.importorskip("torch")


class _IdDataset(torch.utils.data.Dataset):
    """Returns the sample id it was asked for, and the DataLoader worker that read it."""

    def __len__(self) -> int:
        return 10**9

    def __getitem__(self, i: int):
        info = torch.utils.data.get_worker_info()
        return torch.tensor([i, -1 if info is None else info.id])


def _loader_steps(plan: Plan, start: int, stop: int, num_workers: int) -> dict[int, list[np.ndarray]]:
    """Per step, the samples every rank read through a real DataLoader, checking which worker read each micro batch."""
    from detsampler import DeterministicBatchSampler

    per_step: dict[int, list[np.ndarray]] = {s: [] for s in range(start, stop)}
    for rank in range(plan.world_size):
        sampler = DeterministicBatchSampler(plan, rank, start_step=start, stop_step=stop)
        loader = torch.utils.data.DataLoader(_IdDataset(), batch_sampler=sampler, num_workers=num_workers)
        for step, micro_batches in sampler.steps(loader):
            for a, mb in enumerate(micro_batches):
                ids, workers = mb[:, 0].numpy(), mb[:, 1].numpy()
                assert (ids == plan.micro_batch(step, a, rank)).all()
                if num_workers:
                    worker = int(workers[0])
                    assert (workers == worker).all()
                    assert a in plan.worker_micro_batches(step, rank, worker, num_workers, start_step=start)
                per_step[step].append(ids)
        assert sampler.state_dict() == {"step": stop, "samples_in_step": 0}
    return per_step


@pytest.mark.parametrize("num_workers", [0, 2])
@settings(max_examples=4)
@given(
    sizes=st.lists(st.integers(5, 40), min_size=2, max_size=3),
    data=st.data(),
    seed=seeds,
    resume=st.integers(1, 4),
)
def test_elastic_resume_through_a_dataloader_with_a_mixture(num_workers, sizes, data, seed, resume):
    schedule = data.draw(weight_schedules(len(sizes), max_step=6))
    plan = Plan(
        source=Mixture(sizes, schedule, seed),
        seed=seed,
        global_batch_size=8,
        micro_batch_size=2,
        world_size=2,
        skip_steps=[(resume + 1, resume + 1)],
    )
    before = _loader_steps(plan, 0, resume, num_workers)
    after_plan = plan.with_world(4, 1)  # elastic: 4 ranks, micro batch 1, same global batch
    check_resume(plan, after_plan, resume)
    after = _loader_steps(after_plan, resume, resume + 4, num_workers)
    for step, parts in {**before, **after}.items():
        got = np.sort(np.concatenate(parts))
        assert (got == np.sort(plan.global_batch(step))).all()
        assert (np.sort(plan.with_world(1, 8).global_batch(step)) == got).all()


# -- locate and the dataset adapter
# ---------------------------------------------------------------------------------------


def _three_layouts():
    from detsampler import LayoutConfig, make_layout

    rng = np.random.default_rng(0)
    return [
        make_layout(LayoutConfig(kind=kind, seq_len=16, seed=3), rng.integers(0, 60, size=25))
        for kind in ("concat", "document", "bestfit")
    ]


_LAYOUTS = _three_layouts()


@given(seed=seeds, step=st.integers(0, 50), data=st.data())
def test_locate_resolves_each_sample_in_its_own_sources_layout(seed, step, data):
    from detsampler import locate

    layouts = _LAYOUTS
    mix = Mixture(layouts, data.draw(integer_weights(3)), seed)
    plan = Plan(source=mix, seed=seed, global_batch_size=12, micro_batch_size=3, world_size=2)
    whole = locate(plan, layouts, step)
    assert (whole.sample_ids == plan.global_batch(step)).all()
    look = plan.stream.lookup(plan.step_positions(step))
    assert (whole.sources == look.source).all() and (whole.epochs == look.source_epoch).all()
    for i in range(len(whole.sample_ids)):
        own = layouts[int(whole.sources[i])].locate(whole.source_sample_ids[i : i + 1])
        assert whole.spans.sample(i) == own.sample(0)
    part = locate(plan, mix, step, rank=1, micro_step=1)  # the mixture itself stands for its layouts
    assert (part.sample_ids == plan.micro_batch(step, 1, 1)).all()
    assert [part.spans.sample(i) for i in range(3)] == [whole.spans.sample(i) for i in range(9, 12)]


def test_locate_refuses_a_single_layout_for_a_mixture():
    from detsampler import LayoutConfig, locate, make_layout

    layout = make_layout(LayoutConfig(seq_len=8), np.full(20, 30))
    plan = Plan(source=Mixture([layout, layout], [1, 1], 0), seed=0, global_batch_size=4, micro_batch_size=2)
    with pytest.raises(ValueError, match="pass their layouts"):
        locate(plan, layout, 0)
    with pytest.raises(ValueError, match="source 1 has"):
        locate(plan, [layout, make_layout(LayoutConfig(seq_len=4), np.full(20, 30))], 0)


class _Tagged(torch.utils.data.Dataset):
    def __init__(self, tag: int, n: int) -> None:
        self.tag, self.n = tag, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        assert 0 <= i < self.n
        return torch.tensor([self.tag, i])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_mixture_dataset_serves_each_source_sample_through_a_dataloader(num_workers):
    from detsampler import DeterministicBatchSampler, MixtureDataset

    mix = Mixture([13, 7, 30], [(0, [2, 1, 0]), (3, [1, 1, 2])], seed=9)
    plan = Plan(source=mix, seed=1, global_batch_size=8, micro_batch_size=4, world_size=2)
    dataset = MixtureDataset([_Tagged(k, n) for k, n in enumerate(mix.sizes)], mix)
    sampler = DeterministicBatchSampler(plan, rank=1, stop_step=6)
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, num_workers=num_workers)
    for step, micro_batches in sampler.steps(loader):
        for a, batch in enumerate(micro_batches):
            look = plan.stream.lookup(plan.micro_batch_positions(step, a, 1))
            assert (batch[:, 0].numpy() == look.source).all() and (batch[:, 1].numpy() == look.source_sample).all()
    with pytest.raises(ValueError, match=r"datasets\[1\] has 8 samples"):
        MixtureDataset([_Tagged(0, 13), _Tagged(1, 8), _Tagged(2, 30)], mix)


# -- pins and cost
# --------------------------------------------------------------------------------------------------------


def test_pinned_mixture_ids():
    """Exact outputs: a change here changes every mixture run's data (bump MAPPING_VERSION on purpose if so)."""
    mix = Mixture([100, 50, 30], [(0, [0.5, 0.3, 0.2]), (4, [1, 1, 2])], seed=7)
    plan = Plan(source=mix, seed=0, global_batch_size=8, micro_batch_size=2, world_size=2, skip_steps=[(2, 2)])
    assert [plan.global_batch(s).tolist() for s in (0, 3, 5)] == [
        [6, 73, 111, 9, 152, 105, 27, 37],
        [171, 120, 179, 67, 167, 141, 168, 36],
        [162, 101, 153, 43, 165, 104, 159, 95],
    ]
    far = Mixture([10**9, 3 * 10**9], [1, 3], seed=1).sample_ids(np.array([0, 10**15, 10**15 + 1, 2**60]))
    assert far.tolist() == [1111496441, 2762344126, 592569563, 2653853202]


def test_pinned_mixture_ids_version_1():
    """Version 1's outputs, as the first release computed them (the routing is the same; the source shuffles differ)."""
    mix = Mixture([100, 50, 30], [(0, [0.5, 0.3, 0.2]), (4, [1, 1, 2])], seed=7)
    plan = Plan(
        source=mix,
        seed=0,
        global_batch_size=8,
        micro_batch_size=2,
        world_size=2,
        skip_steps=[(2, 2)],
        mapping_version=1,
    )
    assert [plan.global_batch(s).tolist() for s in (0, 3, 5)] == [
        [94, 93, 124, 92, 153, 118, 61, 74],
        [178, 131, 159, 48, 167, 103, 151, 35],
        [170, 145, 173, 56, 174, 141, 163, 53],
    ]
    far = Mixture([10**9, 3 * 10**9], [1, 3], seed=1, mapping_version=1).sample_ids(
        np.array([0, 10**15, 10**15 + 1, 2**60])
    )
    assert far.tolist() == [1061388743, 3747138047, 937306914, 3619923107]


def test_mixture_and_plan_agree_on_the_mapping_version():
    mix = Mixture([100, 50], [1, 1], seed=7, mapping_version=1)
    assert Plan(source=mix, global_batch_size=4, micro_batch_size=2, mapping_version=1).stream.version == 1
    with pytest.raises(ValueError, match="built for mapping version 1 but the Plan asks for 2"):
        Plan(source=mix, global_batch_size=4, micro_batch_size=2)
    with pytest.raises(ValueError, match=r"allowed mapping versions are \(1, 2, 3\)"):
        Mixture([100, 50], [1, 1], seed=7, mapping_version=4)


def test_far_positions_cost_what_near_ones_cost():
    """Step 10**12 of a scheduled mixture: closed-form counts, no array larger than the batch."""
    import tracemalloc

    mix = Mixture([10**6, 10**5, 37], [(0, [6, 3, 1]), (10**11, [1, 1, 1]), (10**12, [2, 0, 1])], seed=3)
    plan = Plan(source=mix, seed=0, global_batch_size=1024, micro_batch_size=16, world_size=8)
    tracemalloc.start()
    look = plan.stream.lookup(plan.step_positions(10**12 + 5))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 4 * 2**20
    assert not (look.source == 1).any()  # weight 0 in the last segment
    served = plan.stream.served(plan.consumed(10**12 + 5))
    assert served.sum() == plan.consumed(10**12 + 5)
    # p_k continues from the reached position: the batch's positions of each source are consecutive from served[k]
    for k in (0, 2):
        mine = look.source_position[look.source == k]
        assert (mine == served[k] + np.arange(mine.size)).all()


def test_mixture_config_maps_a_toml_table_onto_the_mixture():
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    table = tomllib.loads("""
        [mixture]
        names = ["web", "code", "books"]
        weights = [0.7, 0.2, 0.1]
        schedule = [{step = 5, weights = ["2/5", "1/5", "2/5"]}]
        seed = 3
    """)["mixture"]
    config = MixtureConfig(**table)
    mix = config.build([40, 30, 20])
    assert mix == Mixture([40, 30, 20], [(0, [0.7, 0.2, 0.1]), (5, ["2/5", "1/5", "2/5"])], 3)
    assert mix.schedule == ((0, (7, 2, 1)), (5, (2, 1, 2)))
    with pytest.raises(ValueError, match="after step 0"):
        MixtureConfig(weights=[1, 1], schedule=[(0, [1, 2])])
    with pytest.raises(ValueError, match="strictly increasing"):
        MixtureConfig(weights=[1, 1], schedule=[(5, [1, 2]), (5, [1, 1])])
    with pytest.raises(ValueError, match=r"weights\[1\] must be >= 0"):
        MixtureConfig(weights=[1, -1])
    with pytest.raises(ValueError, match="keys step and weights"):
        MixtureConfig(weights=[1, 1], schedule=[{"step": 5, "weight": [1, 2]}])
    with pytest.raises(ValueError, match="names must be one"):
        MixtureConfig(weights=[1, 1], names=["a"])
    with pytest.raises(ValueError, match="2 weights but got 3 sources"):
        MixtureConfig(weights=[1, 1]).build([1, 2, 3])


@given(seed=seeds, data=st.data(), steps=st.integers(1, 40))
def test_report_counts_the_tokens_each_source_served(seed, data, steps):
    layouts = _LAYOUTS
    mix = Mixture(layouts, data.draw(integer_weights(3)), seed)
    plan = Plan(source=mix, seed=seed, global_batch_size=6, micro_batch_size=3)
    position = plan.consumed(steps)
    look = plan.stream.lookup(np.arange(position))
    report = plan.stream.report(position, chunk=7)
    for k, lay in enumerate(layouts):
        mine = look.source_sample[look.source == k]
        expected = int(np.minimum(lay.locate(mine).num_tokens, lay.config.seq_len).sum()) if mine.size else 0
        assert report[k]["served"] == mine.size and report[k]["tokens"] == expected
    assert sum(r["tokens"] for r in report) == sum(
        int(np.minimum(lay.locate(look.source_sample[look.source == k]).num_tokens, 16).sum())
        for k, lay in enumerate(layouts)
    )


def test_sizes_and_positions_beyond_int64_arithmetic_are_refused():
    """Issue 11, item 6: every size, total and position a Mixture accepts is one its int64
    arithmetic computes exactly."""
    with pytest.raises(
        ValueError, match=r"sources\[0\] has 9223372036854775808 samples; a source holds at most 2\*\*62"
    ):
        Mixture([2**63, 3], [1, 1], 0)
    with pytest.raises(ValueError, match=r"the sources hold 9223372036854775813 samples in all; at most 2\*\*63 - 1"):
        Mixture([2**62, 2**62, 5], [1, 1, 1], 0)
    mix = Mixture([2**62, 2**62 - 1], [1, 1], 0)  # the largest: ids up to 2**63 - 2 fit
    assert mix.sample_ids(np.array([0, 1, 2**62 - 1])).min() >= 0
    last = Mixture([10, 20, 30], [1, 2, 3], seed=4)
    end = 2**62 - 1
    look = last.lookup(np.array([end]))
    served = last.served(end + 1) - last.served(end)  # the source that position `end` went to, by the closed form
    assert served.tolist() == [int(k == look.source[0]) for k in range(3)]
    with pytest.raises(ValueError, match=r"Got position 4611686018427387904, allowed positions are in \[0, 2\*\*62\)"):
        last.sample_ids(np.array([2**62]))
    with pytest.raises(
        ValueError, match=r"position must be an integer <= 4611686018427387904, got 4611686018427387905"
    ):
        last.served(2**62 + 1)
    with pytest.raises(ValueError, match=r"step_positions must be .* at most 2\*\*62"):
        Mixture([10, 20], [(0, [1, 1]), (5, [1, 2])], 0, step_positions=(0, 2**62 + 8))


def test_small_mixture_flaws_of_issue_11():
    """Item 7: numpy weights read like their Python values, clear errors for a string of names and a missing segment."""
    assert Mixture([10, 10], [np.float32(0.1), np.float32(0.9)], 0).schedule == ((0, (1, 9)),)
    assert Mixture([10, 10], np.array([0.25, 0.75]), 0).schedule == ((0, (1, 3)),)
    assert Mixture([10, 10], [(0, np.array([1, 1])), (3, np.array([np.float16(0.5), 1]))], 0).schedule == (
        (0, (1, 1)),
        (3, (1, 2)),
    )
    with pytest.raises(ValueError, match=r"weights must be one weight per source or a schedule .*got a 2-D array"):
        Mixture([10, 10], np.array([[0.5, 0.5]]), 0)
    config = MixtureConfig(weights=np.array([np.float32(0.1), np.float32(0.9)]), schedule=[(5, np.array([1, 1]))])
    assert config.build([10, 10]).schedule == ((0, (1, 9)), (5, (1, 1)))
    with pytest.raises(ValueError, match="names must be a list of strings, one per source, got 'ab'"):
        MixtureConfig(weights=[1, 1], names="ab")
    with pytest.raises(ValueError, match=r"Got segment 5, allowed segments are in \[0, 1\)"):
        Mixture([10, 10], [1, 1], 0).discrepancy_bounds(5)


def test_plan_seed_does_not_key_a_mixture_and_a_resume_may_change_it():
    """Item 7: a mixture has its own seed; the plan's is unused, so changing it on resume changes nothing and is
    accepted."""
    mix = Mixture([100, 50], [1, 1], seed=7)
    a = Plan(source=mix, seed=1, global_batch_size=4, micro_batch_size=2)
    b = Plan(source=mix, seed=2, global_batch_size=4, micro_batch_size=2)
    assert all(np.array_equal(a.global_batch(s), b.global_batch(s)) for s in range(5))
    check_resume(a.fingerprint(), b, 3)
    with pytest.raises(ValueError, match="seed"):
        check_resume(
            Plan(100, 1, 4, 2).fingerprint(), Plan(100, 2, 4, 2), 3
        )  # an epoch stream's seed keys its shuffles
