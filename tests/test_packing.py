"""Best-fit packing (detsampler.packing): the lockstep implementation gives the bins of the reference implementation
(PACKING_VERSION 1 as first written: a Python loop over a sorted list of ``(remaining, bin)``), kept here verbatim in
substance, byte for byte on random windows (ties, documents longer than ``seq_len``, empty windows, extents of 0)."""

from __future__ import annotations

import bisect

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from detsampler.packing import Packed, _SuccessorSets, pack_best_fit, pack_windows


def reference_pack_best_fit(extents: np.ndarray, capacity: int):
    """PACKING_VERSION 1's original implementation (one window): the reference the fast one must equal."""
    extents = np.asarray(extents, dtype=np.int64)
    full = extents // capacity
    full_doc_idx = np.repeat(np.arange(len(extents)), full)
    full_piece = np.concatenate([np.arange(f) for f in full.tolist()] or [np.zeros(0, np.int64)]).astype(np.int64)
    full_starts = full_piece * capacity
    rest = extents - full * capacity
    rest_idx = np.flatnonzero(rest)
    rest_idx = rest_idx[np.argsort(-rest[rest_idx], kind="stable")]
    free: list[tuple[int, int]] = []  # (remaining capacity, bin), sorted
    members: list[list[int]] = []
    for doc in rest_idx.tolist():
        size = int(rest[doc])
        k = bisect.bisect_left(free, (size, -1))
        if k == len(free):
            members.append([doc])
            bisect.insort(free, (capacity - size, len(members) - 1))
        else:
            remaining, b = free.pop(k)
            members[b].append(doc)
            bisect.insort(free, (remaining - size, b))
    packed_docs = np.array([d for m in members for d in m], dtype=np.int64)
    counts = np.concatenate([np.ones(len(full_doc_idx), np.int64), [len(m) for m in members]]).astype(np.int64)
    bin_offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=bin_offsets[1:])
    docs = np.concatenate([full_doc_idx, packed_docs])
    starts = np.concatenate([full_starts, full[packed_docs] * capacity])
    stops = np.concatenate([full_starts + capacity, extents[packed_docs]])
    return bin_offsets, docs, starts, stops


def reference_pack_windows(window_docs, extents, seq_len: int) -> Packed:
    bins, per_bin, docs, pieces = [], [], [], []
    for ids, ext in zip(window_docs, extents):
        bin_offsets, items, starts, _ = reference_pack_best_fit(ext, seq_len)
        bins.append(len(bin_offsets) - 1)
        per_bin.append(np.diff(bin_offsets))
        docs.append(np.asarray(ids, dtype=np.int64)[items])
        pieces.append((starts // seq_len).astype(np.uint32))
    cat = lambda parts, dt: np.concatenate(parts).astype(dt) if parts else np.zeros(0, dt)
    return Packed(np.asarray(bins, dtype=np.int64), cat(per_bin, np.int64), cat(docs, np.int64), cat(pieces, np.uint32))


def assert_same_bytes(got: Packed, want: Packed) -> None:
    for field in ("bins_per_window", "items_per_bin", "item_docs", "item_pieces"):
        a, b = getattr(got, field), getattr(want, field)
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), field


# small capacities and few distinct sizes make ties (equal remainders, equal remaining capacities) the common case
capacities = st.sampled_from([1, 2, 3, 7, 16, 64, 200, 4097])
windows = st.lists(st.lists(st.integers(0, 40), max_size=60), max_size=12)


@given(capacity=capacities, sizes=windows, scale=st.sampled_from([1, 3, 50]))
def test_pack_windows_equals_the_reference_byte_for_byte(capacity, sizes, scale):
    extents = [np.asarray(w, dtype=np.int64) * scale for w in sizes]
    ids = [np.arange(len(e), dtype=np.int64) * 7 + 1000 * i for i, e in enumerate(extents)]
    assert_same_bytes(pack_windows(ids, extents, capacity), reference_pack_windows(ids, extents, capacity))


@given(capacity=capacities, sizes=st.lists(st.integers(0, 300), max_size=200))
def test_pack_best_fit_equals_the_reference(capacity, sizes):
    got, want = pack_best_fit(np.array(sizes, dtype=np.int64), capacity), reference_pack_best_fit(sizes, capacity)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and np.array_equal(a, b)


def test_many_windows_in_several_lockstep_groups_equal_the_reference(monkeypatch):
    """Windows split into several lockstep groups (by the state and document bounds) pack as one by one."""
    import detsampler.packing as packing

    rng = np.random.default_rng(5)
    extents = [rng.integers(1, 5000, size=rng.integers(0, 300)) for _ in range(40)]
    ids = [rng.permutation(10**6)[: len(e)] for e in extents]
    want = reference_pack_windows(ids, extents, 2048)
    assert_same_bytes(pack_windows(ids, extents, 2048), want)
    monkeypatch.setattr(packing, "LOCKSTEP_DOCS", 500)
    assert len(packing._groups([len(e) for e in extents], 2048)) > 10
    assert_same_bytes(pack_windows(ids, extents, 2048), want)


@given(size=st.integers(1, 300_000), ops=st.lists(st.tuples(st.booleans(), st.integers(0, 10**9)), max_size=80))
def test_successor_sets_answer_as_a_sorted_set(size, ops):
    sets, model = _SuccessorSets(3, size), set()
    for add, x in ops:  # row 1 changes; rows 0 and 2 stay empty
        x %= size
        if (x in model) != add:
            sets.update(np.array([0, x, 0]), np.array([False, True, False]), insert=add)
            (model.add if add else model.discard)(x)
        for q in (x, 0, size - 1):
            got = sets.successor(np.array([q, q, q])).tolist()
            assert got == [-1, min((v for v in model if v >= q), default=-1), -1]


@given(size=st.integers(1, 5000), values=st.lists(st.integers(0, 10**6), max_size=50))
def test_successor_sets_assigned_at_once_equal_one_by_one(size, values):
    values = np.array(values, dtype=np.int64) % size
    rows = np.arange(len(values)) % 2
    members = np.zeros((2, size), bool)
    members[rows, values] = True
    many, single = _SuccessorSets(2, size), _SuccessorSets(2, size)
    many.assign(members)
    for r, v in zip(rows.tolist(), values.tolist()):
        single.update(np.array([v, v]), np.array([r == 0, r == 1]), insert=True)
    for a, b in zip(many.levels, single.levels):
        assert a.tobytes() == b.tobytes()
