"""VerifiedArray: checked reads equal plain reads; a fenced search equals np.searchsorted; an edited chunk is
refused."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from detsampler.index.checksums import ChecksumError, open_checked, write_checksums, write_fence
from detsampler.index.files import save_npy


def _checked(tmp_path, values: np.ndarray, fence: bool):
    save_npy(tmp_path / "a.npy", values)
    files = {"a.npy": write_checksums(tmp_path, "a.npy")}
    if fence:
        files["a.npy"]["fence"] = write_fence(tmp_path, "a.npy")
    return open_checked(tmp_path, files, "a.npy", values.dtype, values.shape)


@given(n=st.integers(1, 40_000), seed=st.integers(0, 2**32 - 1), side=st.sampled_from(["left", "right"]))
def test_a_fenced_search_equals_numpy(tmp_path_factory, n, seed, side):
    rng = np.random.default_rng(seed)
    values = np.cumsum(rng.integers(0, 3, size=n))  # sorted, with runs of equal values across block boundaries
    arr = _checked(tmp_path_factory.mktemp("a"), values, fence=True)
    queries = np.concatenate([rng.integers(-2, values[-1] + 3, size=64), values[:: max(1, n // 50)]])
    np.testing.assert_array_equal(arr.searchsorted(queries, side=side), np.searchsorted(values, queries, side=side))
    idx = rng.integers(0, n, size=100)
    np.testing.assert_array_equal(arr[idx], values[idx])
    assert arr.verified <= len(arr._sums)


@given(n=st.integers(1, 40_000), seed=st.integers(0, 2**32 - 1), side=st.sampled_from(["left", "right"]))
def test_a_fenced_int32_search_with_int64_queries_equals_numpy(tmp_path_factory, n, seed, side):
    """Queries are searched in the array's dtype when they fit it (no per-block copy), else as given: the same answers,
    at the dtype's edges and beyond them too."""
    rng = np.random.default_rng(seed)
    top = np.iinfo(np.int32).max
    values = (top - 3 * n + np.cumsum(rng.integers(0, 4, size=n))).astype(np.int32)  # may reach 2^31 - 1
    arr = _checked(tmp_path_factory.mktemp("a"), values, fence=True)
    inside = np.concatenate([rng.integers(int(values[0]) - 2, top + 1, size=64), values[:: max(1, n // 50)], [top]])
    for queries in (inside.astype(np.int64), np.append(inside, [top + 1, 2**40, -(2**40)]).astype(np.int64)):
        want = np.searchsorted(values.astype(np.int64), queries, side=side)
        np.testing.assert_array_equal(arr.searchsorted(queries, side=side), want)


@pytest.mark.parametrize("fence", [False, True])
def test_an_edited_chunk_is_refused_by_reads_and_searches(tmp_path, fence):
    values = np.arange(100_000, dtype=np.int64) * 2
    arr = _checked(tmp_path, values, fence)
    raw = np.load(tmp_path / "a.npy", mmap_mode="r+")
    raw[50_000] += 1  # still sorted: only the checksum can tell
    raw.flush()
    del raw
    assert arr.searchsorted(np.array([10]))[0] == 5  # another chunk: served
    with pytest.raises(ChecksumError, match="a.npy chunk 6 .* fails its checksum"):
        arr.searchsorted(np.array([100_000]))
    with pytest.raises(ChecksumError):
        arr[np.array([50_001])]


@given(
    n=st.integers(1, 120_000),
    seed=st.integers(0, 2**32 - 1),
    num_ranges=st.one_of(st.integers(0, 6), st.integers(33, 40)),  # walked in Python ints, or vectorized
)
def test_checked_ranges_checks_exactly_the_chunks_of_its_ranges(tmp_path_factory, n, seed, num_ranges):
    """``checked_ranges`` marks as checked every chunk holding an element of a non-empty range, and no other."""
    rng = np.random.default_rng(seed)
    values = rng.integers(0, 2**15, size=n).astype(np.uint16)
    tmp = tmp_path_factory.mktemp("r")
    arr = _checked(tmp, values, fence=False)
    starts = rng.integers(0, n + 1, size=num_ranges)
    stops = np.minimum(starts + rng.integers(0, 80_000, size=num_ranges), n)
    got = arr.checked_ranges(starts, stops)
    np.testing.assert_array_equal(got, values)
    offset = arr._data_offset
    want = np.zeros(len(arr._sums), dtype=bool)
    for a, b in zip(starts.tolist(), stops.tolist()):
        if b > a:
            want[(offset + 2 * a) >> 16 : ((offset + 2 * b - 1) >> 16) + 1] = True
    np.testing.assert_array_equal(arr._checked, want)


@pytest.mark.parametrize("copies", [1, 40])  # few ranges (Python ints) or many (vectorized)
def test_checked_ranges_refuses_an_edited_chunk_and_ranges_out_of_bounds(tmp_path, copies):
    values = np.arange(200_000, dtype=np.int64)
    arr = _checked(tmp_path, values, fence=False)
    raw = np.load(tmp_path / "a.npy", mmap_mode="r+")
    raw[150_000] += 1
    raw.flush()
    del raw
    assert arr.checked_ranges(np.array([0, 10]), np.array([5, 40_000]))[3] == 3  # chunks 0-4: served
    with pytest.raises(ChecksumError, match="fails its checksum"):
        arr.checked_ranges(np.full(copies, 100_000), np.full(copies, 160_000))  # the edited chunk is in the middle
    with pytest.raises(IndexError, match="outside"):
        arr.checked_ranges(np.full(copies, 199_999), np.full(copies, 200_001))


@pytest.mark.parametrize("copies", [1, 40])
def test_checked_ranges_checks_the_second_chunk_of_a_range_whose_first_is_checked(tmp_path, copies):
    arr = _checked(tmp_path, np.arange(100_000, dtype=np.int64), fence=False)
    arr.checked_ranges(np.zeros(copies, dtype=np.int64), np.full(copies, 10))
    assert arr._checked.tolist()[:3] == [True, False, False]
    arr.checked_ranges(np.full(copies, 8_000), np.full(copies, 9_000))  # 64 KiB = 8192 values: chunks 0 and 1
    assert arr._checked.tolist()[:3] == [True, True, False]


@pytest.mark.parametrize("copies", [1, 40])  # few ranges or many
def test_an_array_whose_chunks_are_all_checked_reads_plainly_with_the_same_answers_and_bounds(tmp_path, copies):
    """Once every chunk is checked, reads, searches and checked_ranges go to the map directly (issue 35): the same
    values and answers as numpy, and a range outside the array is still refused, empty ranges anywhere not."""
    values = np.cumsum(np.arange(50_000, dtype=np.int64) % 7)
    arr = _checked(tmp_path, values, fence=True)
    idx, queries = np.array([0, 17, 49_999, -1]), np.array([-5, 0, 3, int(values[-1]), int(values[-1]) + 9])
    before = (arr[idx], arr.searchsorted(queries, side="right"), arr[10:20])
    assert arr._unchecked > 0
    arr.verify_all()
    assert arr._unchecked == 0
    after = (arr[idx], arr.searchsorted(queries, side="right"), arr[10:20])
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(after[1], np.searchsorted(values, queries, side="right"))
    assert arr.checked_ranges(np.full(copies, 10), np.full(copies, 20))[15] == values[15]
    assert arr.checked_ranges(np.full(copies, 70_000), np.full(copies, 70_000)) is not None  # empty: nothing read
    with pytest.raises(IndexError, match="outside"):
        arr.checked_ranges(np.full(copies, 49_999), np.full(copies, 50_001))


def test_a_search_of_an_int32_array_whose_chunks_are_all_checked_is_made_in_its_dtype(tmp_path):
    """With every chunk checked, int64 queries that fit the array's int32 are searched in its dtype (numpy would copy
    the whole map to int64 on every search: benchmark 11's document locate at 10^6 documents took twice as long): the
    same answers as numpy, in the queries' shape, those that do not fit int32 included."""
    values = np.cumsum(np.arange(300_000) % 5).astype(np.int32)
    arr = _checked(tmp_path, values, fence=True)
    arr.verify_all()
    queries = np.array([[-1, 0, 7], [int(values[-1]), int(values[-1]) + 1, 2**40]], dtype=np.int64)
    got = arr.searchsorted(queries, side="right")
    np.testing.assert_array_equal(got, np.searchsorted(values.astype(np.int64), queries, side="right"))
    assert got.shape == queries.shape
