"""The keyed permutation, in every mapping version: a bijection for every n and key, inverted by unpermute, well mixed,
independent across keys. (Its statistics against numpy's permutation: tests/test_permutation_stats.py.)"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from detsampler.permutation import MAX_DOMAIN, Permutation, permute, unpermute
from detsampler.version import MAPPING_VERSIONS
from tests.strategies import domain_sizes, seeds

PERMUTATIONS = tuple(v for v in MAPPING_VERSIONS if v != 3)  # version 3 permutes as version 2 (tests/test_pinned.py)

versions = st.sampled_from(PERMUTATIONS)


@given(n=domain_sizes, key=seeds, version=versions)
@example(n=1, key=0, version=2)
@example(n=2, key=0, version=2)
@example(n=2**16 + 1, key=7, version=2)
@example(n=2**16 + 1, key=7, version=1)
def test_permutation_is_a_bijection_and_inverse_inverts(n, key, version):
    x = np.arange(n, dtype=np.int64)
    y = permute(x, n, key, version)
    assert y.dtype == np.int64
    np.testing.assert_array_equal(np.sort(y), x)
    np.testing.assert_array_equal(unpermute(y, n, key, version), x)
    np.testing.assert_array_equal(permute(unpermute(x, n, key, version), n, key, version), x)


@pytest.mark.parametrize("version", PERMUTATIONS)
@pytest.mark.parametrize("k", [1, 2, 3, 7, 8, 10, 11, 15, 16, 20])
@pytest.mark.parametrize("delta", [-1, 0, 1])
def test_bijection_around_powers_of_two(k, delta, version):
    n = 2**k + delta
    for key in (0, 1, 2**63 + 12345):
        assert np.array_equal(np.sort(permute(np.arange(n), n, key, version)), np.arange(n))


@given(n=domain_sizes, keys=st.lists(seeds, min_size=1, max_size=4), version=versions)
def test_per_element_keys_match_scalar_keys(n, keys, version):
    x = np.arange(n, dtype=np.int64)
    which = x % len(keys)
    key_array = np.array(keys, dtype=np.uint64)[which]
    expected = np.empty(n, dtype=np.int64)
    for i, key in enumerate(keys):
        expected[which == i] = permute(x[which == i], n, key, version)
    np.testing.assert_array_equal(permute(x, n, key_array, version), expected)
    np.testing.assert_array_equal(unpermute(expected, n, key_array, version), x)


@pytest.mark.parametrize("version", PERMUTATIONS)
@pytest.mark.parametrize("n", [10**12, 2**40 + 3, MAX_DOMAIN - 1, MAX_DOMAIN])
def test_large_domain_pointwise_without_materializing(n, version):
    x = np.array([0, 1, 2, n // 2, n - 2, n - 1] + list(range(3, 100)), dtype=np.int64)  # past the Python-int path
    y = permute(x, n, 42, version)
    assert ((y >= 0) & (y < n)).all() and len(set(y.tolist())) == len(x)
    np.testing.assert_array_equal(unpermute(y, n, 42, version), x)
    np.testing.assert_array_equal(permute(x[:6], n, 42, version), y[:6])  # the Python-int path agrees
    assert Permutation(n, 3, version).inverse(Permutation(n, 3, version)[5]) == 5


@pytest.mark.parametrize("version", PERMUTATIONS)
@pytest.mark.parametrize("n", [2**16, 2**16 + 1, 3 * 2**15 + 5])
def test_every_input_bit_reaches_the_low_output_bits(n, version):
    """A weak round (multiply-add) leaves low output bits a function of low input bits; ours must not."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, n, size=20000)
    y = permute(x, n, 99, version)
    bits = (n - 1).bit_length()
    for bit in range(bits):
        flipped = x ^ (1 << bit)
        ok = flipped < n
        if ok.sum() < 2000:  # a top bit that few in-domain pairs differ in
            continue
        z = permute(flipped[ok], n, 99, version)
        for out_bit in (0, 1):
            changed = (((y[ok] ^ z) >> out_bit) & 1).mean()
            assert 0.4 < changed < 0.6, (bit, out_bit, changed)


@pytest.mark.parametrize("version", PERMUTATIONS)
def test_different_keys_look_independent(version):
    n = 4096
    x = np.arange(n)
    a, b = permute(x, n, 1, version), permute(x, n, 2, version)
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.1
    assert (a == b).mean() < 0.01  # about 1/n agree by chance
    assert abs(np.corrcoef(x, a)[0, 1]) < 0.1


def test_bad_input():
    with pytest.raises(ValueError, match=r"n must be in \[1, 2\*\*62\], got 0"):
        permute(np.arange(1), 0, 1)
    with pytest.raises(ValueError, match=r"Got index 10, allowed index are in \[0, 10\)"):
        permute(np.arange(11), 10, 1)
    with pytest.raises(ValueError, match=r"Got index -1"):
        permute(np.array([-1]), 10, 1)
    with pytest.raises(TypeError, match="integers"):
        permute(np.array([0.5]), 10, 1)
    with pytest.raises(ValueError, match=r"Got mapping version 4, allowed mapping versions are \(1, 2, 3\)"):
        permute(np.arange(3), 10, 1, 4)
    with pytest.raises(ValueError, match="mapping version"):
        Permutation(10, 1, 0)


large_domain_sizes = st.one_of(domain_sizes, st.integers(min_value=1025, max_value=MAX_DOMAIN))


@given(n=large_domain_sizes, key=seeds, version=versions, data=st.data())
def test_few_indices_path_equals_the_array_path(n, key, version, data):
    """Up to ``_FEW`` indices go through Python ints; the values must be the numpy network's, both ways."""
    from detsampler import permutation_v1, permutation_v2

    module = {1: permutation_v1, 2: permutation_v2}[version]
    x = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=module._FEW)), dtype=np.int64)
    few = permute(x, n, key, version)
    saved = module._FEW
    module._FEW = -1
    try:
        np.testing.assert_array_equal(permute(x, n, key, version), few)
        np.testing.assert_array_equal(unpermute(few, n, key, version), x)
    finally:
        module._FEW = saved
    np.testing.assert_array_equal(unpermute(few, n, key, version), x)


@given(z=st.integers(min_value=0, max_value=2**64 - 1))
def test_python_int_mix_equals_the_numpy_mix(z):
    from detsampler.keys import mix64, mix64_int

    assert mix64_int(z) == int(mix64(np.array([z], dtype=np.uint64))[0])
