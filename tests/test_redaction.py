"""Redaction that moves nothing else: validation, the fingerprint (absent without redactions), check_resume (allowed
from the resume step on, refused before), the invariant "every step reads what it read; labels differ exactly at the
redacted documents' positions from ``from_step`` on" (against ``where``'s spans), and the audit trail."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from detsampler.layout import LayoutConfig
from detsampler.loader.dataset import PackedDataset
from detsampler.loader.redact import redact_labels
from detsampler.plan import Plan
from detsampler.record import DataRecord
from detsampler.redaction import Blocklist, Redaction, normalize_redactions, redacted_at, redaction_mask
from detsampler.resume import DataFingerprint, check_resume
from detsampler.where import redaction_audit, where

# -- validation


def test_redaction_is_validated_and_sorted():
    assert Redaction([5, 2, 9], 3).documents == (2, 5, 9)
    assert Redaction(np.array([4, 1]), np.int64(2)) == Redaction((1, 4), 2)
    for bad in ([1.0], [-1], [True], ["3"]):
        with pytest.raises(ValueError, match="document ids"):
            Redaction(bad, 0)
    with pytest.raises(ValueError, match="names no document"):
        Redaction([], 0)
    with pytest.raises(ValueError, match="more than once"):
        Redaction([3, 3], 0)
    with pytest.raises(ValueError, match="from_step must be an integer >= 0"):
        Redaction([1], -1)
    with pytest.raises(ValueError, match="from_step must be an integer"):
        Redaction([1], 2.0)
    with pytest.raises(ValueError, match="document ids"):
        Redaction("12", 0)


def test_normalize_redactions():
    out = normalize_redactions([{"documents": [7], "from_step": 9}, [2, [3, 1]], Redaction([4], 5)])
    assert [r.to_list() for r in out] == [[2, [1, 3]], [5, [4]], [9, [7]]]
    assert normalize_redactions(None) == ()
    with pytest.raises(ValueError, match="two redactions from step 2"):
        normalize_redactions([Redaction([1], 2), Redaction([3], 2)])
    with pytest.raises(ValueError, match="document 1 is redacted from step 2 and again from step 4"):
        normalize_redactions([Redaction([1], 2), Redaction([1, 3], 4)])
    with pytest.raises(ValueError, match="documents = "):
        normalize_redactions([{"documents": [1]}])
    assert redacted_at(out, 1).tolist() == []
    assert redacted_at(out, 5).tolist() == [1, 3, 4]
    blocklist = Blocklist(out)
    for step in range(12):
        want = sorted(d for r in out if r.from_step <= step for d in r.documents)
        assert blocklist.at(step).tolist() == redacted_at(out, step).tolist() == want
    with pytest.raises(ValueError, match="step must be an integer >= 0"):
        blocklist.at(-1)
    assert redaction_mask(np.array([[1, 4, 7, -1]]), 5, out).tolist() == [[True, True, False, False]]


# -- the plan and its fingerprint


def test_fingerprint_unchanged_without_redactions_and_samples_unchanged_with():
    base = Plan(100, seed=3, global_batch_size=8, micro_batch_size=2, world_size=2)
    red = Plan(100, seed=3, global_batch_size=8, micro_batch_size=2, world_size=2, redactions=[Redaction([4], 3)])
    assert "redactions" not in base.fingerprint()
    assert red.fingerprint()["redactions"] == [[3, [4]]]
    assert {k: v for k, v in red.fingerprint().items() if k != "redactions"} == base.fingerprint()
    for s in range(30):
        assert base.global_batch(s).tolist() == red.global_batch(s).tolist()
    assert red.with_world(1, 4).redactions == red.redactions
    with pytest.raises(ValueError, match="mixture"):
        from detsampler.mixture import Mixture

        Plan(
            source=Mixture([50, 50], [0.5, 0.5], seed=1),
            global_batch_size=4,
            micro_batch_size=2,
            redactions=[Redaction([1], 0)],
        )


def _fp(redactions):
    plan = Plan(100, seed=3, global_batch_size=8, micro_batch_size=2, redactions=redactions)
    return DataFingerprint("idx", {"kind": "concat"}, plan.fingerprint())


def test_check_resume_allows_redactions_from_the_resume_step_on():
    old = _fp(None)
    check_resume(old, _fp([Redaction([4], 10)]), 10)  # at the resume step
    check_resume(old.to_dict(), _fp([Redaction([4], 12)]).to_dict(), 10)  # after, through JSON
    earlier = _fp([Redaction([4], 3)])
    check_resume(earlier, _fp([Redaction([4], 3), Redaction([5], 10)]), 10)  # the past kept, one added
    check_resume(_fp([Redaction([4], 12)]), _fp([Redaction([4, 6], 11)]), 10)  # a future one brought forward
    check_resume(_fp([Redaction([4], 12)]), _fp([Redaction([4], 10), Redaction([6], 12)]), 10)  # and one added


def test_check_resume_refuses_dropping_or_postponing_a_recorded_redaction():
    """Issue 32: a takedown recorded for a later step was dropped in silence by a resume whose config forgot it."""
    recorded = _fp([Redaction([4], 3), Redaction([5, 7], 12)])
    with pytest.raises(ValueError, match=r"step 10 drops the redaction of document 5 from step 12 \(2 document"):
        check_resume(recorded, _fp([Redaction([4], 3)]), 10)
    with pytest.raises(ValueError, match=r"step 10 postpones to step 14 the redaction of document 5 from step 12"):
        check_resume(recorded, _fp([Redaction([4], 3), Redaction([5, 7], 14)]), 10)


def test_check_resume_refuses_redactions_before_the_resume_step():
    with pytest.raises(ValueError, match=r"redactions adds \[\[9, \[4\]\]\].*before training step 10"):
        check_resume(_fp(None), _fp([Redaction([4], 9)]), 10)
    with pytest.raises(ValueError, match=r"redactions removes \[\[3, \[4\]\]\]"):
        check_resume(_fp([Redaction([4], 3)]), _fp(None), 10)
    with pytest.raises(ValueError, match="redactions adds"):
        check_resume(_fp([Redaction([4], 3)]), _fp([Redaction([4, 5], 3)]), 10)


def test_record_rebuilds_a_plan_with_redactions(small_index):
    layout = small_index.layout(LayoutConfig(kind="document", seq_len=64, seed=1))
    plan = Plan(layout.num_samples, seed=2, global_batch_size=4, micro_batch_size=2, redactions=[Redaction([1], 2)])
    record = DataRecord.of(5, small_index, layout, plan)
    again = DataRecord.from_json(record.to_json())
    assert again.plan(layout.num_samples).redactions == plan.redactions


# -- the invariant: nothing else moves


@pytest.mark.parametrize("kind", ["concat", "document", "bestfit"])
def test_redaction_moves_nothing_else(small_index, kind):
    seq_len = 64
    layout = small_index.layout(LayoutConfig(kind=kind, seq_len=seq_len, seed=11))
    ds = PackedDataset(small_index, layout)
    # redact the documents of two samples read early, one from step 2 and one from step 5
    base = Plan(layout.num_samples, seed=4, global_batch_size=8, micro_batch_size=2, world_size=2)
    first = ds.get_batch(base.micro_batch(0, 0, 0))["document_ids"].numpy()
    docs = [int(d) for d in np.unique(first[first >= 0])]
    assert len(docs) >= 2
    redactions = [Redaction(docs[:1], 2), Redaction(docs[1:3], 5)]
    plan = Plan(
        layout.num_samples, seed=4, global_batch_size=8, micro_batch_size=2, world_size=2, redactions=redactions
    )
    steps = 2 * layout.num_samples // 8 + 1  # past an epoch boundary: a sample read before and after from_step
    expected = {}  # (step, micro step, rank, row) -> positions whose labels the redaction masks
    for r in redactions:
        for d in r.documents:
            for read in where(plan, layout, d, (r.from_step, steps)):
                cells = expected.setdefault((read.step, read.micro_step, read.rank, read.row), set())
                cells.update(range(read.offset, min(read.offset + read.stop - read.start, seq_len)))
    for r in redactions:  # each redacted document is read both before its step and after it (in another epoch)
        for d in r.documents:
            read_at = {x.step for x in where(plan, layout, d, (0, steps))}
            assert min(read_at) < r.from_step <= max(read_at), (d, sorted(read_at))
    masked = 0
    for s in range(steps):
        for a in range(plan.num_micro_steps(s)):
            for rank in range(plan.world_size):
                ids = plan.micro_batch(s, a, rank)
                assert ids.tolist() == base.micro_batch(s, a, rank).tolist()
                clean, batch = ds.get_batch(ids), ds.get_batch(ids)
                changed = redact_labels(batch, s, plan.redactions if s % 2 else Blocklist(plan.redactions))
                for k in ("input_ids", "position_ids", "document_ids"):
                    assert torch.equal(clean[k], batch[k])
                diff = clean["labels"] != batch["labels"]
                assert int(diff.sum()) == changed
                assert (batch["labels"][diff] == -100).all()
                for row in range(len(ids)):
                    want = expected.get((s, a, rank, row), set())
                    want = {p for p in want if int(clean["labels"][row, p]) != -100}
                    assert set(torch.nonzero(diff[row]).flatten().tolist()) == want, (s, a, rank, row)
                masked += changed
    assert masked > 0


def test_redaction_audit_is_where_before_from_step(small_index):
    layout = small_index.layout(LayoutConfig(kind="concat", seq_len=64, seed=11))
    docs = list(range(4))
    plan = Plan(
        layout.num_samples,
        seed=4,
        global_batch_size=8,
        micro_batch_size=2,
        redactions=[Redaction(docs[:2], 6), Redaction(docs[2:], 40)],
    )
    audit = redaction_audit(plan, layout)
    assert [(e["document"], e["from_step"]) for e in audit] == [(0, 6), (1, 6), (2, 40), (3, 40)]
    for e in audit:
        reads = where(plan, layout, e["document"], (0, e["from_step"]))
        assert e["steps"] == sorted({r.step for r in reads}) and e["reads"] == len(reads)
        assert e["tokens"] == sum(min(r.stop - r.start, 64 - r.offset) for r in reads)
    stopped = redaction_audit(plan, layout, stop=10)
    assert all(max(e["steps"], default=-1) < 10 for e in stopped)
    assert sum(e["tokens"] for e in audit) > 0


# -- the audit trail in stats and verify --checkpoint


def test_stats_and_verify_print_the_audit_trail_of_a_checkpoint(capsys, small_index, tmp_path):
    import json

    from detsampler.cli import main
    from detsampler.cli.redactions import _ranges

    assert _ranges([0, 3, 4, 5, 9]) == "0, 3..5, 9" and _ranges([]) == ""

    layout = small_index.layout(LayoutConfig(kind="document", seq_len=64, seed=7))
    plan = Plan(
        layout.num_samples,
        seed=3,
        global_batch_size=8,
        micro_batch_size=2,
        world_size=2,
        redactions=[Redaction([0, 5], 4), Redaction([9], 20)],
    )
    DataRecord.of(8, small_index, layout, plan, framework="hf").save(tmp_path)
    audit = redaction_audit(plan, layout, stop=8)
    assert main(["stats", "--checkpoint", str(tmp_path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["redactions"]
    assert [{k: v for k, v in r.items() if k != "trained"} for r in rows] == audit
    # the labels trained (issue 32): a document layout masks the label at each span's last position, nothing else
    assert [r["trained"] for r in rows] == [r["tokens"] - r["reads"] for r in rows]
    assert main(["stats", "--checkpoint", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for row in rows:
        head = f"redacted doc {row['document']}: "
        line = next(line for line in out.splitlines() if line.startswith(head))
        trained = f"trained at steps [{_ranges(row['steps'])}]" if row["steps"] else "trained at no step"
        reads = f"{row['reads']} read{'' if row['reads'] == 1 else 's'}"
        counts = f"({row['tokens']:,} tokens read, {row['trained']:,} trained, {reads})"
        assert line.startswith(f"{head}{trained} before step {row['from_step']} {counts}"), line
        assert ("counted to step 8" in line) == (row["from_step"] > 8)
    assert any(row["steps"] for row in audit)
    assert main(["verify", "--checkpoint", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert sum(line.startswith("redacted doc ") for line in out.splitlines()) == 3
    # every step that read a redacted document before its step is named, exactly
    for row in audit:
        reads = where(plan, layout, row["document"], (0, min(row["from_step"], 8)))
        assert row["steps"] == sorted({r.step for r in reads})


def test_the_redact_option(capsys, cache_root, small_tokenizer, small_index, tmp_path):
    import json

    from detsampler.cli import main

    base = ["--max-documents", "16", "--tokenizer", small_tokenizer.path, "--cache-dir", str(cache_root)]
    opts = ["--kind", "bestfit", "--seq-len", "64", "--global-batch-size", "8", "--redact", "6:3,1", "--redact", "2:7"]
    layout = small_index.layout(LayoutConfig(kind="bestfit", seq_len=64))
    plan = Plan(
        layout.num_samples,
        seed=0,
        global_batch_size=8,
        micro_batch_size=2,
        redactions=[Redaction([1, 3], 6), Redaction([7], 2)],
    )
    assert main(["stats", *base, *opts, "--kinds", "bestfit", "--step", "9", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["redactions"]
    assert [{k: v for k, v in r.items() if k != "trained"} for r in rows] == redaction_audit(plan, layout, 9)
    assert main(["verify", *base, *opts, "--steps", "0:9"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("redacted doc ")]
    assert [line.split(":")[0] for line in lines] == ["redacted doc 7", "redacted doc 1", "redacted doc 3"]
    # against a checkpoint: the recorded redactions are the default; another list contradicts it
    DataRecord.of(9, small_index, layout, plan).save(tmp_path)
    assert main(["verify", "--checkpoint", str(tmp_path), "--redact", "2:7", "--redact", "6:1,3"]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(["verify", "--checkpoint", str(tmp_path), "--redact", "2:7"])
    assert exc.value.code == 2 and "--redact [[2,[7]]] contradicts the checkpoint" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["verify", *base, "--steps", "0:4", "--redact", "3"])
    assert exc.value.code == 2 and "expected [SOURCE:]FROM_STEP:DOC[,DOC...]" in capsys.readouterr().err


def test_where_marks_the_reads_a_redaction_masks(capsys, cache_root, small_tokenizer, small_index):
    import json

    from detsampler.cli import main

    base = ["--max-documents", "16", "--tokenizer", small_tokenizer.path, "--cache-dir", str(cache_root)]
    opts = ["--kind", "document", "--seq-len", "64", "--global-batch-size", "8", "--doc", "2", "--steps", "0:900"]
    assert main(["where", *base, *opts, "--redact", "437:2", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["redacted_from"] == 437
    assert main(["where", *base, *opts, "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert "redacted_from" not in plain and plain["reads"] == got["reads"]  # the same reads
    assert main(["where", *base, *opts, "--redact", "437:2"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  step ")]
    assert len(lines) == len(got["reads"])
    assert {r["step"] >= 437 for r in got["reads"]} == {False, True}  # read before the redaction and after it
    for line, read in zip(lines, got["reads"]):
        assert line.endswith("  redacted") == (read["step"] >= 437)


# -- verify --against: the proof that a redaction moved nothing else


def _saved(step, index, layout, plan, directory):
    directory.mkdir()
    DataRecord.of(step, index, layout, plan, framework="train").save(directory)
    return str(directory)


def test_verify_against_the_checkpoint_before_the_redaction(capsys, small_index, tmp_path):
    """``verify --checkpoint NEW --against OLD``: the data changes between the records (the resume rule's verdict) and
    whether every step reads the samples OLD's plan reads there; exit 1 when the resume rule refuses the change."""
    from detsampler.cli import main

    layout = small_index.layout(LayoutConfig(kind="bestfit", seq_len=64, seed=7))
    cut = dict(seed=3, global_batch_size=8, micro_batch_size=2, world_size=2)
    old = _saved(8, small_index, layout, Plan(layout.num_samples, **cut), tmp_path / "old")
    redacted = Plan(layout.num_samples, **cut, redactions=[Redaction([0, 5], 8)])
    new = _saved(16, small_index, layout, redacted, tmp_path / "new")
    assert main(["verify", "--checkpoint", new, "--against", old]) == 0
    out = capsys.readouterr().out.splitlines()
    assert f"against {old}: saved at step 8, data changes plan.redactions: '<absent>' -> [[8, [0, 5]]]" in out
    assert "  accepted by the resume rule at step 8 (check_resume)" in out
    assert "  steps 0..15: every step reads the samples its plan reads (16 steps, 128 samples)" in out
    assert out[-1] == "OK: no duplicates, no gaps"
    # a redaction before the older checkpoint's step: the same samples, but the past changed
    early = Plan(layout.num_samples, **cut, redactions=[Redaction([0], 4)])
    path = _saved(16, small_index, layout, early, tmp_path / "e")
    assert main(["verify", "--checkpoint", path, "--against", old]) == 1
    out = capsys.readouterr().out.splitlines()
    assert any(line.startswith("  refused by the resume rule at step 8: redactions adds [[4, [0]]]") for line in out)
    assert "  steps 0..15: every step reads the samples its plan reads (16 steps, 128 samples)" in out
    assert out[-1] == "FAILED: the data changed before step 8"
    # another plan seed moves every step
    moved = Plan(layout.num_samples, **{**cut, "seed": 4})
    path = _saved(16, small_index, layout, moved, tmp_path / "m")
    assert main(["verify", "--checkpoint", path, "--against", old]) == 1
    out = capsys.readouterr().out.splitlines()
    plain = Plan(layout.num_samples, **cut)
    differ = [s for s in range(16) if sorted(moved.global_batch(s)) != sorted(plain.global_batch(s))]
    shown = f"{differ[0]}, {differ[1]}, {differ[2]} ..."
    assert f"  steps 0..15: {len(differ)} step(s) read other samples than its plan: {shown}" in out
    assert out[-1] == "FAILED: the data changed before step 8"
    # another layout: the samples are other samples, not compared
    other = small_index.layout(LayoutConfig(kind="bestfit", seq_len=64, seed=8))
    path = _saved(16, small_index, other, Plan(other.num_samples, **cut), tmp_path / "l")
    assert main(["verify", "--checkpoint", path, "--against", old]) == 1
    out = capsys.readouterr().out.splitlines()
    refusal = "  refused by the resume rule at step 8: resuming at step 8 changes the layout"
    assert any(line.startswith(refusal) for line in out)
    assert "  samples not compared: the index or layout differs" in out
    with pytest.raises(SystemExit) as exc:
        main(["verify", "--steps", "0:4", "--against", old])
    assert exc.value.code == 2 and "--against needs --checkpoint" in capsys.readouterr().err


def test_where_finds_a_document_by_its_content_hash(capsys, cache_root, small_tokenizer, small_index):
    """``where --sha256 HEX``: a contamination audit starts from a text (a benchmark's item), not from an id."""
    import json

    from detsampler.cli import main
    from detsampler.redaction import content_hash
    from detsampler.text.corpus import default_corpus

    texts = default_corpus(max_documents=16)["text"]
    base = ["--max-documents", "16", "--tokenizer", small_tokenizer.path, "--cache-dir", str(cache_root)]
    opts = ["--kind", "document", "--seq-len", "64", "--global-batch-size", "8", "--steps", "0:300", "--json"]
    assert main(["where", *base, *opts, "--doc", "5"]) == 0
    by_id = json.loads(capsys.readouterr().out)
    assert main(["where", *base, *opts, "--sha256", content_hash(texts[5]).upper()]) == 0
    assert json.loads(capsys.readouterr().out) == by_id
    for argv, message in [
        (["--sha256", content_hash("not in the corpus")], "name no document"),
        (["--sha256", "xyz"], "64 hexadecimal digits"),
        (["--sha256", content_hash(texts[5]), "--doc", "5"], "where needs one of --doc ID, --path FILE, --sha256 HEX"),
    ]:
        with pytest.raises(SystemExit) as exc:
            main(["where", *base, *opts, *argv])
        assert exc.value.code == 2 and message in capsys.readouterr().err, argv


def test_where_refuses_a_content_hash_of_several_documents(capsys, cache_root, small_tokenizer, tmp_path):
    from detsampler.cli import main
    from detsampler.redaction import content_hash

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name, text in [("a.txt", "def f():\n    return 1\n"), ("b.txt", "x = 2\n"), ("c.txt", "x = 2\n")]:
        (corpus / name).write_text(text)
    argv = ["where", "--data", str(corpus), "--tokenizer", small_tokenizer.path, "--cache-dir", str(cache_root)]
    argv += ["--seq-len", "16", "--steps", "0:4", "--quiet"]
    assert main([*argv, "--sha256", content_hash("def f():\n    return 1\n")]) == 0
    assert capsys.readouterr().out.startswith("doc 0: 11 tokens + EOS")
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--sha256", content_hash("x = 2\n")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "names 2 documents with equal text ([1, 2]): give --doc ID" in err


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 2**26), min_size=1, max_size=40, unique=True),
    st.lists(st.integers(-3, 2**26 + 5), min_size=0, max_size=60),
    st.integers(0, 3),
)
def test_the_blocklist_mask_is_isin(blocked, doc_ids, from_step):
    """``Blocklist.mask`` (a lookup table while the largest redacted id is small, else ``np.isin``) and
    ``redact_labels``' numpy path mark exactly ``np.isin(document_ids, redacted ids)``, padding (-1) and any other
    negative id never."""
    blocklist = Blocklist([Redaction(blocked, from_step)])
    ids = np.array(doc_ids + blocked[:3] + [-1], dtype=np.int64).reshape(1, -1)
    for step in (from_step - 1, from_step, from_step + 5):
        if step < 0:
            continue
        want = np.isin(ids, blocklist.at(step))
        assert np.array_equal(blocklist.mask(ids, step), want)
        assert np.array_equal(redaction_mask(ids, step, [Redaction(blocked, from_step)]), want)
        labels = torch.arange(ids.size).reshape(ids.shape)
        labels[0, 0] = -100
        batch = {"document_ids": torch.from_numpy(ids.copy()), "labels": labels}
        changed = redact_labels(batch, step, blocklist)
        want_changed = want.copy()
        want_changed[0, 0] = False
        assert changed == int(want_changed.sum())
        assert torch.equal(batch["labels"] == -100, torch.from_numpy(want) | (torch.arange(ids.size) == 0)[None, :])


@settings(max_examples=80, deadline=None)
@given(
    st.integers(1, 6),
    st.integers(1, 60),
    st.integers(1, 12),
    st.booleans(),
    st.integers(0, 2**32 - 1),
)
def test_redact_labels_equals_a_lookup_per_position_on_packed_batches(rows, width, longest, by_source, seed):
    """On batches shaped like packed ones (document ids in runs of 1 to ``longest`` positions, padding -1 among them),
    redact_labels' labels and count equal a lookup per position (np.isin of each row with its source's ids in force),
    few and many runs redacted, with and without mixture sources."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, longest + 1, size=rows * width)
    ids = np.repeat(rng.integers(-1, 25, size=lengths.size), lengths)[: rows * width].reshape(rows, width)
    labels = rng.integers(-100, 50, size=(rows, width))
    labels[labels < 0] = -100
    source_of = rng.integers(0, 2, size=rows) if by_source else None
    redactions = [
        Redaction(sorted(set(rng.integers(0, 25, size=10).tolist())), int(rng.integers(0, 3)), k if by_source else None)
        for k in range(2 if by_source else 1)
    ]
    blocklist = Blocklist(redactions)
    for step in range(4):
        want = np.zeros(ids.shape, dtype=bool)
        for r in range(rows):
            want[r] = np.isin(ids[r], blocklist.at(step, None if source_of is None else int(source_of[r])))
        want &= labels != -100
        batch = {"document_ids": torch.from_numpy(ids.copy()), "labels": torch.from_numpy(labels.copy())}
        assert redact_labels(batch, step, blocklist, source_of) == int(want.sum())
        assert np.array_equal(batch["labels"].numpy(), np.where(want, -100, labels))
