"""Shared test configuration: Hypothesis profiles selected by HYPOTHESIS_PROFILE (``dev`` by default, ``ci`` in CI)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=60, deadline=None)
settings.register_profile(
    "ci",
    max_examples=40,
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("thorough", max_examples=1000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


# -- shared corpora, tokenizers and indexes (built once per test session, small so that the suite stays fast)
# --------------

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def cache_root(tmp_path_factory):
    """A session-wide cache directory for tokenizers and indexes."""
    return tmp_path_factory.mktemp("detsampler-cache")


@pytest.fixture(scope="session")
def small_corpus():
    """The first 16 standard-library sources by path: real documents, a few hundred thousand characters."""
    from detsampler.text.corpus import default_corpus

    return default_corpus(max_documents=16)


@pytest.fixture(scope="session")
def small_tokenizer(cache_root, small_corpus):
    """A 512-piece BPE tokenizer trained on ``small_corpus`` (cached for the session)."""
    from detsampler.text.corpus import default_tokenizer

    return default_tokenizer(cache_root, vocab_size=512, corpus=small_corpus)


@pytest.fixture(scope="session")
def small_index(cache_root, small_corpus, small_tokenizer):
    """The token index of ``small_corpus`` with stored tokens."""
    from detsampler.index import build_index

    return build_index(small_corpus, small_tokenizer, cache_dir=cache_root, progress=False)


# -- object storage: moto's real S3 server on loopback, one per session
# ------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def s3_endpoint():
    """The endpoint of moto's S3 server on 127.0.0.1 (a free port), with ``AWS_*`` set for the session."""
    from tests.s3_server import moto_server

    with moto_server() as (endpoint, _server):
        yield endpoint


@pytest.fixture(scope="session")
def s3_bucket(s3_endpoint):
    """``s3://detsampler-test``: a bucket on the session's server."""
    from tests.s3_server import create_bucket

    return create_bucket(s3_endpoint, "detsampler-test")
