"""The detsampler CLI: every dataclass field has its option, and build/show/verify/stats/tokenizer train print what the
library computes."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields

import numpy as np
import pytest

from detsampler.balance import CostModel
from detsampler.cli import OPTION_FIELDS, build_parser, main
from detsampler.index.prepare import IndexConfig
from detsampler.layout import LayoutConfig
from detsampler.locate import locate
from detsampler.media import MediaLayoutConfig
from detsampler.mixture import MixtureConfig
from detsampler.plan import Plan
from detsampler.text.tokenizer import Tokenizer
from detsampler.verify import verify_plan


@pytest.fixture()
def base_args(cache_root, small_tokenizer, small_index):
    """Options selecting the session's small corpus (first 16 stdlib files), tokenizer and cache:
    the index is cached."""
    return ["--max-documents", "16", "--tokenizer", small_tokenizer.path, "--cache-dir", str(cache_root)]


def _run(capsys, argv):
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_options_map_one_to_one_onto_the_dataclasses():
    mapped = {(cls, name) for cls, name in OPTION_FIELDS.values()}
    want = {("IndexConfig", f.name) for f in fields(IndexConfig)}
    want |= {("LayoutConfig", f.name) for f in fields(LayoutConfig)}
    # NOTE: Plan.epoch_ids follows --epoch-order (LayoutConfig.epoch_order): one option, not two that must agree
    want |= {("Plan", f.name) for f in fields(Plan) if f.init and f.name not in ("num_samples", "source", "epoch_ids")}
    want |= {("MixtureConfig", f.name) for f in fields(MixtureConfig)}
    want |= {("CostModel", f.name) for f in fields(CostModel)}  # --balance's cost model
    # NOTE: a media index's layout reads --seq-len, --layout-seed, --window-docs and --overlong; only its cap is its own
    want |= {("MediaLayoutConfig", "max_patches")}
    assert {f.name for f in fields(MediaLayoutConfig)} == {"seq_len", "seed", "window_docs", "overlong", "max_patches"}
    assert mapped == want
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices
    for command in ("show", "verify", "stats", "where"):
        dests = {a.dest for a in sub[command]._actions}
        assert set(OPTION_FIELDS) <= dests, command
        help_text = sub[command].format_help()
        for action in sub[command]._actions:
            if action.dest in OPTION_FIELDS:
                assert action.option_strings[0] in help_text and action.help
    assert {f.name for f in fields(IndexConfig)} <= {a.dest for a in sub["build"]._actions}


def test_help_exits_cleanly(capsys):
    for argv in (["--help"], ["build", "--help"], ["show", "--help"], ["tokenizer", "train", "--help"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 0
        assert "usage: detsampler" in capsys.readouterr().out


def test_build_prints_the_summary(capsys, base_args, small_index):
    code, out, _ = _run(capsys, ["build", *base_args, "--json"])
    summary = json.loads(out)
    assert code == 0 and summary["path"] == str(small_index.path)
    assert summary["num_documents"] == small_index.num_documents and summary["num_tokens"] == small_index.num_tokens
    code, out, _ = _run(capsys, ["build", *base_args])
    assert f"{small_index.num_documents:,}" in out and str(small_index.path) in out and "tokens/s" in out


def test_show_lists_the_located_spans(capsys, base_args, small_index, small_tokenizer):
    opts = [
        "--kind",
        "document",
        "--seq-len",
        "64",
        "--global-batch-size",
        "8",
        "--micro-batch-size",
        "2",
        "--world-size",
        "2",
    ]
    code, out, _ = _run(
        capsys,
        ["show", *base_args, *opts, "--step", "5", "--rank", "1", "--micro-step", "1", "--decode", "--max-chars", "0"],
    )
    assert code == 0
    layout = small_index.layout(LayoutConfig(kind="document", seq_len=64))
    plan = Plan(layout.num_samples, seed=0, global_batch_size=8, micro_batch_size=2, world_size=2)
    loc = locate(plan, layout, 5, rank=1, micro_step=1)
    for i, sid in enumerate(loc.sample_ids.tolist()):
        assert f"sample {sid} " in out
        for doc, s, e in loc.spans.sample(i):
            n = int(small_index.lengths[doc])
            assert f"doc {doc} (" in out and f"tokens [{s}, {min(e, n)})" in out
            text = small_tokenizer.decode(small_index.document_tokens(doc)[s : min(e, n)].tolist()) + (
                "<EOS>" if e > n else ""
            )
            assert repr(text) in out
    assert "rank 0" not in out
    code, out, _ = _run(capsys, ["show", *base_args, *opts, "--step", "5"])
    assert out.count("micro step") >= 4 and "rank 0 micro step 0" in out and "rank 1 micro step 1" in out


def test_verify_and_stats(capsys, base_args, small_index):
    opts = [
        "--kind",
        "bestfit",
        "--seq-len",
        "128",
        "--window-docs",
        "4",
        "--global-batch-size",
        "12",
        "--micro-batch-size",
        "3",
        "--world-size",
        "2",
    ]
    layout = small_index.layout(LayoutConfig(kind="bestfit", seq_len=128, window_docs=4))
    steps = 2 * layout.num_samples // 12 + 3
    code, out, _ = _run(capsys, ["verify", *base_args, *opts, "--steps", f"0:{steps}"])
    assert code == 0 and "OK: no duplicates, no gaps" in out
    assert "epoch 0:" in out and "epoch 1:" in out and "complete" in out and "epoch 2:" in out
    code, out, _ = _run(
        capsys, ["stats", *base_args, "--seq-len", "128", "--window-docs", "4", "--step", "100", "--json"]
    )
    stats = json.loads(out)
    assert stats["documents"] == small_index.num_documents and stats["tokens"] == small_index.num_tokens
    for kind in ("concat", "document", "bestfit"):
        lay = small_index.layout(LayoutConfig(kind=kind, seq_len=128, window_docs=4))
        row = stats["layouts"][kind]
        assert row["samples_per_epoch"] == lay.num_samples
        assert row["padding_fraction"] == lay.describe()["padding_fraction"]
        assert row["epochs_at_step"] == 100 * 8 / lay.num_samples
    code, out, _ = _run(capsys, ["stats", *base_args, "--step", "7"])
    assert code == 0 and "bestfit" in out and "padding" in out


@dataclass(frozen=True)
class _RepeatingStream:
    """A deliberately broken stream (one sample read twice per epoch, one never), to show verify catches it."""

    num_samples: int

    def sample_ids(self, positions):
        within = np.asarray(positions) % self.num_samples
        return np.where(within == self.num_samples - 1, 0, within)

    def epochs(self, positions):
        return np.asarray(positions) // self.num_samples

    def describe(self):
        return {"kind": "broken"}

    def with_step_positions(self, consumed):
        return self

    def with_mapping_version(self, version):
        return self


def test_verify_plan_catches_duplicates_and_gaps():
    good = verify_plan(Plan(10, seed=1, global_batch_size=4, micro_batch_size=1, world_size=2), 0, 6)
    assert good["ok"] and [r["complete"] for r in good["epochs"]] == [True, True, False]
    bad = verify_plan(
        Plan(source=_RepeatingStream(10), seed=1, global_batch_size=4, micro_batch_size=1, world_size=2), 0, 6
    )
    assert not bad["ok"]
    assert bad["epochs"][0]["duplicates"] == 1 and bad["epochs"][0]["gaps"] == 1


def test_tokenizer_train_command(capsys, tmp_path, small_corpus):
    src = tmp_path / "src"
    src.mkdir()
    for i, text in enumerate(small_corpus["text"][:5]):
        (src / f"{i}.py").write_text(text)
    out_model = tmp_path / "tok.model"
    code, out, _ = _run(
        capsys, ["tokenizer", "train", "--input", str(src), "--vocab-size", "350", "--out", str(out_model)]
    )
    tok = Tokenizer.load(out_model)
    assert code == 0 and tok.vocab_size == 350 and tok.sha256 in out


def test_bad_input_exits_with_a_message(capsys, tmp_path, base_args):
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "build",
                "--tokenizer",
                str(tmp_path / "missing.model"),
                "--max-documents",
                "2",
                "--cache-dir",
                str(tmp_path),
            ]
        )
    assert exc.value.code == 2 and "no sentencepiece model file" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["build", "--data", str(tmp_path / "nothing"), "--cache-dir", str(tmp_path)])
    assert exc.value.code == 2 and "does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["show", *base_args, "--step", "0", "--global-batch-size", "6", "--micro-batch-size", "4"])
    assert exc.value.code == 2 and "not divisible" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["verify", *base_args, "--steps", "5:2"])
    assert exc.value.code == 2 and "A:B" in capsys.readouterr().err


def test_mapping_version_from_a_number_or_a_checkpoint(capsys, base_args, small_index, tmp_path):
    """``--mapping-version`` takes a version, or the checkpoint of a run, whose recorded version the
    command then uses."""
    import json

    from detsampler.cli.options import mapping_version

    layout = small_index.layout(LayoutConfig(kind="concat", seq_len=64))
    v1 = Plan(layout.num_samples, seed=0, global_batch_size=8, micro_batch_size=2, mapping_version=1)
    ckpt = tmp_path / "step_00000004"
    ckpt.mkdir()
    (ckpt / "data_fingerprint.json").write_text(json.dumps({"step": 4, "data_fingerprint": {"plan": v1.fingerprint()}}))
    assert (
        mapping_version(str(ckpt)) == mapping_version(str(ckpt / "data_fingerprint.json")) == mapping_version("1") == 1
    )
    opts = ["--kind", "concat", "--seq-len", "64", "--global-batch-size", "8", "--micro-batch-size", "2", "--step", "3"]
    outs = [
        _run(capsys, ["show", *base_args, *opts, *extra])[1]
        for extra in ([], ["--mapping-version", "1"], ["--mapping-version", str(ckpt)])
    ]
    assert outs[1] == outs[2] != outs[0]
    for sid in v1.global_batch(3).tolist():
        assert f"sample {sid} " in outs[1]
    (tmp_path / "empty.json").write_text("{}")
    for bad, message in (
        ("4", "must be one of (1, 2, 3)"),
        (str(tmp_path / "empty.json"), "records no mapping version"),
        (str(tmp_path / "missing"), "expected a mapping version or a checkpoint"),
    ):
        with pytest.raises(SystemExit) as exc:
            main(["show", *base_args, *opts, "--mapping-version", bad])
        assert exc.value.code == 2 and message in capsys.readouterr().err


def test_verify_with_skip_steps_reports_skipped_data_not_gaps(capsys, base_args, small_index):
    """Issue 11, item 1: a correct plan with a skip range verifies OK; the skipped data is reported as skipped."""
    opts = [
        "--kind",
        "concat",
        "--seq-len",
        "64",
        "--global-batch-size",
        "8",
        "--micro-batch-size",
        "2",
        "--world-size",
        "2",
    ]
    layout = small_index.layout(LayoutConfig(kind="concat", seq_len=64))
    steps = 2 * layout.num_samples // 8
    code, out, _ = _run(capsys, ["verify", *base_args, *opts, "--skip-steps", "2..3", "--steps", f"0:{steps}"])
    assert code == 0 and "OK: no duplicates, no gaps" in out, out
    assert "skipped: data steps 2..3 (16 positions, never trained on" in out
    assert "16 skipped, duplicates 0, gaps 0, complete" in out


def test_where_lists_the_reads_of_a_document(capsys, base_args, small_index):
    opts = ["--kind", "bestfit", "--seq-len", "64", "--global-batch-size", "8", "--micro-batch-size", "2"]
    opts += ["--world-size", "2", "--skip-steps", "3..5", "--steps", "0:1000"]
    code, out, _ = _run(capsys, ["where", *base_args, *opts, "--doc", "3", "--json"])
    assert code == 0
    got = json.loads(out)
    layout = small_index.layout(LayoutConfig(kind="bestfit", seq_len=64))
    plan = Plan(layout.num_samples, 0, 8, 2, 2, skip_steps=[(3, 5)])
    from detsampler.where import where

    assert got["reads"] == [r._asdict() for r in where(plan, layout, 3, range(1000))] and got["reads"]
    path = got["path"]
    code, out, _ = _run(capsys, ["where", *base_args, *opts, "--path", path])
    assert code == 0 and f"doc 3 ({path})" in out and f"read {len(got['reads'])} time(s)" in out
    for r in got["reads"]:
        assert f"step {r['step']}  micro step {r['micro_step']}  rank {r['rank']}  row {r['row']}: " in out
    with pytest.raises(SystemExit):
        main(["where", *base_args, *opts])  # neither --doc nor --path


def test_a_refused_command_prints_nothing_on_stdout(capsys, base_args, small_index, small_tokenizer, tmp_path):
    """Issue 31 (re-review): `verify --redact 2:100000 --steps 0:5` printed the epoch report before its one-line error
    (exit 2), and `show --rank 5` its headers; so did `show --micro-step 9`, `show --checkpoint C --rank 5`, `verify`,
    `stats` of a checkpoint whose recorded plan redacts a document the index lacks (`show` and `where` of it, and of
    `--redact 2:100000`, even exited 0), and `build --sharded --layout --kind concat --overlong drop` (the shards'
    lines, then the layout's refusal). Every argument is checked before anything is printed: each of these exits 2
    with one line on stderr and nothing on stdout."""
    from detsampler.record import DataRecord

    plan_args = ["--seq-len", "64", "--global-batch-size", "8", "--micro-batch-size", "2", "--world-size", "2"]
    layout = small_index.layout(LayoutConfig(kind="concat", seq_len=64))
    n = small_index.num_documents
    checkpoints = {}
    for name, redactions in (("plain", None), ("redacts", [(2, [n + 5])])):
        plan = Plan(layout.num_samples, global_batch_size=8, micro_batch_size=2, world_size=2, redactions=redactions)
        checkpoints[name] = tmp_path / name
        checkpoints[name].mkdir()
        DataRecord.of(5, small_index, layout, plan).save(checkpoints[name])
    mixture = ["--tokenizer", str(small_tokenizer.path), "--mixture-data", f"{small_index.path},{small_index.path}"]
    mixture += ["--mixture-weights", "1,1", *plan_args]
    texts = tmp_path / "texts"
    texts.mkdir()
    for k in range(2):
        (texts / f"{k}.txt").write_text(f"text {k} " * 200)
    data = [*base_args, *plan_args]
    redact = ["--redact", f"2:{n + 5}"]
    cases = [
        ["show", *data, "--step", "1", "--rank", "5"],
        ["show", *data, "--step", "1", "--micro-step", "9"],
        ["show", *data, "--step", "1", *redact],
        ["show", "--checkpoint", str(checkpoints["plain"]), "--rank", "5"],
        ["show", "--checkpoint", str(checkpoints["plain"]), "--micro-step", "9"],
        ["show", *mixture, "--step", "1", "--rank", "5"],
        ["show", "--checkpoint", str(checkpoints["redacts"])],
        ["verify", *data, "--steps", "0:5", *redact],
        ["verify", *data, "--steps", "0:5", "--tokens", *redact],
        ["verify", *mixture, "--steps", "0:5", "--redact", f"0:2:{n + 5}"],
        ["verify", "--checkpoint", str(checkpoints["redacts"])],
        ["stats", *data, "--step", "3", *redact],
        ["stats", "--checkpoint", str(checkpoints["redacts"])],
        ["where", *data, "--doc", "1", "--steps", "0:5", *redact],
        ["where", "--checkpoint", str(checkpoints["redacts"]), "--doc", "1"],
        [
            "build",
            *["--sharded", "--data", str(texts), "--tokenizer", str(small_tokenizer.path)],
            *["--cache-dir", str(tmp_path / "cache"), "--layout", "--kind", "concat", "--overlong", "drop"],
        ],
    ]
    for argv in cases:
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        captured = capsys.readouterr()
        assert exit_.value.code == 2, argv
        assert captured.out == "", (argv, captured.out)
        assert captured.err.count("detsampler: error:") == 1, (argv, captured.err)
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").rglob("meta.json"))  # nothing built
