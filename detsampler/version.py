"""Versions that caches and checkpoints record."""

__all__ = ["BALANCED_MAPPING_VERSION", "MAPPING_VERSION", "MAPPING_VERSIONS", "__version__"]

__version__ = "0.1.0"

# The version of the (seed, epoch, step, rank) -> sample mapping and of the layouts' cutting. Every index cache name and
# every checkpoint's data fingerprint includes it. Bump it on purpose whenever any of them would map an argument
# differently; tests/test_pinned.py pins exact outputs so that an accidental change fails loudly.
# Version 2 replaced the permutation of every sample order (plan epochs, mixture sources; docs/design.md section 1).
MAPPING_VERSION = 2
# Version 3 is version 2's permutations with each step's samples spread across (rank, micro step) by their modeled cost
# (detsampler/balance.py): the mapping of a plan with balance=, and only of such a plan. Plans without it stay on 2.
BALANCED_MAPPING_VERSION = 3
# Every version a Plan can still compute (Plan(..., mapping_version=1) resumes a run started on version 1 exactly).
MAPPING_VERSIONS = (1, 2, 3)
