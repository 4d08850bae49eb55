"""Issue 23.2: the best-fit layout's policy for an example longer than ``seq_len`` positions (``overlong``: split,
truncate, drop): every kept example exactly once per epoch, the losses counted, part of the layout's identity."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from detsampler import DataFingerprint, Plan, check_resume
from detsampler.index import TokenIndex
from detsampler.index.layouts import layout_dir
from detsampler.layout import OVERLONG_POLICIES, LayoutConfig, make_layout
from detsampler.where import document_samples
from tests.strategies import doc_lengths


def served(layout) -> dict[int, list[tuple[int, int]]]:
    """Per document, the spans ``(start, stop)`` of one epoch's samples."""
    spans = layout.locate(np.arange(layout.num_samples))
    out: dict[int, list[tuple[int, int]]] = {}
    for d, a, b in zip(spans.doc_ids.tolist(), spans.starts.tolist(), spans.stops.tolist()):
        out.setdefault(d, []).append((a, b))
    return out


@given(
    lengths=doc_lengths(max_docs=40, max_len=60),
    seq_len=st.integers(2, 40),
    window=st.integers(1, 12),
    policy=st.sampled_from(OVERLONG_POLICIES),
)
@example(lengths=np.array([5, 50, 3]), seq_len=8, window=2, policy="drop")
@example(lengths=np.array([7]), seq_len=8, window=1, policy="truncate")  # extent 8 == seq_len: not over-long
@example(lengths=np.array([20, 30]), seq_len=8, window=1, policy="drop")  # nothing left: refused
def test_every_kept_example_is_served_exactly_once_per_epoch(lengths, seq_len, window, policy):
    config = LayoutConfig(kind="bestfit", seq_len=seq_len, seed=3, window_docs=window, overlong=policy)
    extents = lengths.astype(np.int64) + 1
    over = extents > seq_len
    if policy == "drop" and over.all():
        with pytest.raises(ValueError, match="no sample: every document is longer than seq_len"):
            make_layout(config, lengths)
        return
    layout = make_layout(config, lengths)
    got = served(layout)
    if policy == "split":
        want = {d: [(p, min(p + seq_len, int(e))) for p in range(0, int(e), seq_len)] for d, e in enumerate(extents)}
        lost = 0
    elif policy == "truncate":
        want = {d: [(0, min(int(e), seq_len))] for d, e in enumerate(extents)}
        lost = int((extents[over] - seq_len).sum())
    else:
        want = {d: [(0, int(e))] for d, e in enumerate(extents) if e <= seq_len}
        lost = int(extents[over].sum())
    assert {d: sorted(s) for d, s in got.items()} == want
    n = layout.num_samples  # the plan serves every bin once per epoch, so every kept example once, epochs reshuffled
    ids = Plan(n, seed=7, global_batch_size=1, micro_batch_size=1).stream.sample_ids(np.arange(2 * n))
    assert sorted(ids[:n].tolist()) == sorted(ids[n:].tolist()) == list(range(n))
    for d in range(len(lengths)):  # detsampler.where finds each kept example's spans, a dropped one's none
        found = document_samples(layout, d)
        assert sorted(zip(found.starts.tolist(), found.stops.tolist())) == want.get(d, [])
    assert np.all(layout.locate(np.arange(layout.num_samples)).num_tokens <= seq_len)
    d = layout.describe()
    assert d["dropped_tokens"] == lost == layout.num_tokens - layout.tokens_per_epoch
    assert layout.tokens_per_epoch == sum(b - a for s in got.values() for a, b in s)
    if policy == "split":
        assert "overlong" not in d and "examples_truncated" not in d and "examples_dropped" not in d
    else:
        assert d["overlong"] == policy and d[f"examples_{'truncated' if policy == 'truncate' else 'dropped'}"] == int(
            over.sum()
        )


def test_split_is_the_default_and_leaves_every_identity_as_it_was():
    """Before the option, bestfit split over-long documents: the default keeps that packing and the same describe()
    (so resume identities and layout directory names made before are unchanged)."""
    lengths = np.array([3, 40, 7, 12, 25, 1])
    default = make_layout(LayoutConfig(kind="bestfit", seq_len=16, seed=1, window_docs=4), lengths)
    split = make_layout(LayoutConfig(kind="bestfit", seq_len=16, seed=1, window_docs=4, overlong="split"), lengths)
    assert default.describe() == split.describe() and "overlong" not in default.describe()
    assert default.describe()["dropped_tokens"] == 0 and default.tokens_per_epoch == int(lengths.sum()) + 6
    assert served(default) == served(split)


def test_a_resume_with_another_policy_is_refused():
    lengths = np.array([5, 70, 3, 40, 18, 9, 64, 1, 33, 12] * 3)

    def fingerprint(policy: str) -> DataFingerprint:
        layout = make_layout(LayoutConfig(kind="bestfit", seq_len=16, window_docs=8, overlong=policy), lengths)
        return DataFingerprint.of(
            "idx", layout, Plan(layout.num_samples, seed=0, global_batch_size=4, micro_batch_size=2)
        )

    with pytest.raises(ValueError, match="changes the layout"):
        check_resume(fingerprint("split"), fingerprint("truncate"), 3)
    with pytest.raises(ValueError, match="changes the layout"):
        check_resume(fingerprint("truncate"), fingerprint("drop"), 3)
    check_resume(fingerprint("drop"), fingerprint("drop"), 3)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kind": "bestfit", "overlong": "cut"}, r"overlong must be one of \('split', 'truncate', 'drop'\), got 'cut'"),
        ({"kind": "concat", "overlong": "truncate"}, "applies to the bestfit layout only"),
        ({"kind": "document", "overlong": "drop"}, "applies to the bestfit layout only"),
    ],
)
def test_a_bad_overlong_policy_is_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LayoutConfig(seq_len=8, **kwargs)


@pytest.fixture()
def index(small_index, tmp_path):
    dest = tmp_path / small_index.path.name
    shutil.copytree(small_index.path, dest, ignore=shutil.ignore_patterns("layouts", "*.lock"))
    return TokenIndex.open(dest)


def test_a_persisted_layout_keeps_the_policy_in_its_name_record_and_counts(index):
    lengths = np.asarray(index.lengths)
    seq_len = int(np.median(lengths)) + 1  # about half the documents are over-long
    names = set()
    for policy in OVERLONG_POLICIES:
        config = LayoutConfig(kind="bestfit", seq_len=seq_len, seed=2, window_docs=7, overlong=policy)
        persisted, ram = index.layout(config), make_layout(config, lengths)
        assert persisted.describe() == ram.describe() and persisted.tokens_per_epoch == ram.tokens_per_epoch
        assert served(persisted) == served(ram)
        names.add(persisted.path.name)
        record = json.loads((persisted.path / "layout.json").read_text())
        assert record["config"].get("overlong", "split") == policy
        if policy != "split":
            assert f"-{policy}-" in persisted.path.name and record["dropped_tokens"] > 0
        stamp = (persisted.path / "layout.json").stat().st_mtime_ns
        assert TokenIndex.open(index.path).layout(config).path == layout_dir(index, config)
        assert (persisted.path / "layout.json").stat().st_mtime_ns == stamp  # reopened, not rebuilt
    assert len(names) == 3


def test_stats_counts_the_truncated_examples_and_the_tokens_lost(capsys, cache_root, small_tokenizer, small_index):
    from detsampler.cli import main

    base = ["--max-documents", "16", "--tokenizer", small_tokenizer.path, "--cache-dir", str(cache_root)]
    assert main(["stats", *base, "--seq-len", "128", "--overlong", "truncate", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["layouts"]
    extents = np.asarray(small_index.lengths, dtype=np.int64) + 1
    assert rows["bestfit"]["examples_truncated"] == int((extents > 128).sum()) > 0
    assert rows["bestfit"]["dropped_tokens"] == int((extents[extents > 128] - 128).sum())
    assert "overlong" not in rows["concat"] and rows["concat"]["dropped_tokens"] < 128  # its last partial sample
    assert main(["stats", *base, "--seq-len", "128", "--overlong", "drop"]) == 0
    n = int((extents > 128).sum())
    assert f"bestfit: overlong=drop: {n} documents longer than seq_len dropped" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        main(["verify", *base, "--kind", "concat", "--overlong", "drop", "--steps", "0:1"])
    assert exc.value.code == 2
    assert "overlong='drop' applies to the bestfit layout only" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["build", *base, "--overlong", "truncate"])  # no --layout: the option would be ignored
    assert exc.value.code == 2 and "--overlong shapes the layout that only --layout builds" in capsys.readouterr().err
