"""A sharded build that fails or is killed part way (issue 31's leftovers): nothing half-written opens as an index, a
rerun resumes the finished shards, and an error names the shard and its input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from detsampler.cli import main
from detsampler.index import TokenIndexError
from detsampler.index.sharded import open_index
from detsampler.index.shards import input_files, sharded_root


@pytest.fixture()
def corpus(tmp_path, small_corpus) -> Path:
    """Three jsonl files of real documents (the session corpus, split)."""
    data = tmp_path / "data"
    data.mkdir()
    texts = small_corpus["text"]
    for j in range(3):
        with open(data / f"part-{j}.jsonl", "w") as f:
            for text in texts[j::3]:
                f.write(json.dumps({"text": text}) + "\n")
    return data


def _build(corpus: Path, cache: Path, tokenizer) -> list[str]:
    return ["build", "--sharded", "--data", str(corpus), "--tokenizer", tokenizer.path, "--cache-dir", str(cache)]


def _killed_after(shard: int, argv: list[str]) -> None:
    """Run the build ``argv`` in a child that SIGKILLs itself once ``shard`` is claimed."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    child = subprocess.run(
        [sys.executable, "-m", "tests._sharded_kill_child", str(shard), *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr


def _edit_in_place(path: Path) -> None:
    """Change one character of ``path``, its size kept (the sharded root's key, names and sizes, is unchanged)."""
    text = path.read_text()
    at = text.rindex("e")  # in the last document's text (the key "text" comes first on its line)
    path.write_text(text[:at] + "E" + text[at + 1 :])


def test_a_build_killed_between_shards_opens_nothing_and_a_rerun_resumes(corpus, tmp_path, small_tokenizer, capsys):
    """SIGKILL after shard 0 of 3: no manifest, so the root opens as nothing (one line naming it); the rerun builds
    shards 1 and 2 only (shard 0's index is reused, not tokenized again) and equals a build that was never killed."""
    cache = tmp_path / "cache"
    _killed_after(0, _build(corpus, cache, small_tokenizer))
    root = sharded_root(cache, input_files(corpus), small_tokenizer)
    assert sorted(p.name for p in (root / "claims").iterdir()) == ["shard-00000.json"]
    with pytest.raises(TokenIndexError, match="no readable manifest.json.*its build did not finish"):
        open_index(root)
    capsys.readouterr()
    assert main(_build(corpus, cache, small_tokenizer)) == 0
    err = capsys.readouterr().err
    assert err.count("detsampler: tokenized") == 2  # shards 1 and 2; shard 0's index was found built
    assert err.count("detsampler: shard ") == 3
    resumed = open_index(root)
    assert main([*_build(corpus, tmp_path / "clean", small_tokenizer), "--quiet"]) == 0
    clean = open_index(sharded_root(tmp_path / "clean", input_files(corpus), small_tokenizer))
    assert resumed.fingerprint == clean.fingerprint and resumed.num_tokens == clean.num_tokens


def test_a_rebuild_killed_part_way_leaves_no_manifest_that_opens(corpus, tmp_path, small_tokenizer, capsys):
    """A built index, its file 0 edited in place (same size, same root), rebuilt and SIGKILLed after shard 0: the old
    manifest opened as the complete index although shard 0 had been rebuilt since (a half-done rebuild served as
    done). Now the claims are checked on open: refused naming the shard and its input; the rerun completes it."""
    cache = tmp_path / "cache"
    assert main([*_build(corpus, cache, small_tokenizer), "--quiet"]) == 0
    root = sharded_root(cache, input_files(corpus), small_tokenizer)
    before = open_index(root).fingerprint
    _edit_in_place(corpus / "part-0.jsonl")
    _killed_after(0, _build(corpus, cache, small_tokenizer))
    with pytest.raises(TokenIndexError, match=r"shard 0 \(part-0.jsonl\) was rebuilt since manifest.json"):
        open_index(root)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:  # the CLI opening it as --data: one line, exit 2
        main(["build", "--data", str(root), "--json"])
    captured = capsys.readouterr()
    assert exit_.value.code == 2 and captured.out == "" and "shard 0 (part-0.jsonl)" in captured.err
    assert main([*_build(corpus, cache, small_tokenizer), "--quiet"]) == 0
    assert open_index(root).fingerprint != before


@pytest.mark.parametrize("num_proc", [1, 2])
@pytest.mark.parametrize("bad", ["not json", "no text column"])
def test_a_shard_whose_input_is_bad_is_named_and_nothing_opens(
    bad, num_proc, corpus, tmp_path, small_tokenizer, capsys
):
    """File 1 of 3 is not JSON, or holds no `text` column: the error named the file at best (`'data/part-1.jsonl'
    cannot be read as json files`) or nothing at all (`text_column 'text' is not a column of the dataset`); now it
    names the shard and its input, and no manifest is written."""
    (corpus / "part-1.jsonl").write_text('{"text": broken\n' if bad == "not json" else '{"body": "a document"}\n')
    cache = tmp_path / "cache"
    with pytest.raises(SystemExit) as exit_:
        main([*_build(corpus, cache, small_tokenizer), "--num-proc", str(num_proc), "--quiet"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("detsampler: error:") == 1
    line = err[err.index("detsampler: error:") :]
    assert f"shard 1 of 3 ({corpus / 'part-1.jsonl'})" in line, line
    root = sharded_root(cache, input_files(corpus), small_tokenizer)
    assert not (root / "manifest.json").exists()
    with pytest.raises(TokenIndexError, match="no readable manifest.json.*its build did not finish"):
        open_index(root)
