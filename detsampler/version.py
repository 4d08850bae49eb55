"""Versions that caches and checkpoints record."""

__all__ = ["MAPPING_VERSION", "__version__"]

__version__ = "0.1.0"

# The version of the (seed, epoch, step, rank) -> sample mapping and of the layouts' cutting. Every index cache name and every
# checkpoint's data fingerprint includes it. Bump it on purpose whenever any of them would map an argument differently;
# tests/test_pinned.py pins exact outputs so that an accidental change fails loudly.
MAPPING_VERSION = 1
