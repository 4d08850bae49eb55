"""``--json``: stdout carries exactly one JSON document, whatever else the command says (issue 31's leftovers)."""

from __future__ import annotations

import json

import pytest

from detsampler.cli import build_parser, main
from tests.index_copies import copy_with_layouts

_PLAN = ["--seq-len", "64", "--global-batch-size", "8", "--micro-batch-size", "2", "--world-size", "2"]
_LAYOUT = ["--layout", "--kind", "concat", "--seq-len", "64"]

# every way of asking a subcommand for JSON: (name, argv with {base}, {texts}, {cache}, {copy}, {tok} to fill in)
CASES = {
    "build": ["build", "{base}", "--json"],
    "build --layout": ["build", "{base}", *_LAYOUT, "--json"],
    "build --verify-tokens --layout": ["build", "{base}", "--verify-tokens", *_LAYOUT, "--json"],
    "build --sharded": [
        "build",
        "--sharded",
        "--data",
        "{texts}",
        "--tokenizer",
        "{tok}",
        "--cache-dir",
        "{cache}",
        "--json",
    ],
    "build --sharded --layout": [
        "build",
        "--sharded",
        "--data",
        "{texts}",
        "--tokenizer",
        "{tok}",
        "--cache-dir",
        "{cache}",
        *_LAYOUT,
        "--json",
    ],
    "build --shard 0 --num-shards 2": [
        "build",
        "--shard",
        "0",
        "--num-shards",
        "2",
        "--data",
        "{texts}",
        "--tokenizer",
        "{tok}",
        "--cache-dir",
        "{cache}",
        "--json",
    ],
    "build --finalize": [
        "build",
        "--finalize",
        "--data",
        "{texts}",
        "--tokenizer",
        "{tok}",
        "--cache-dir",
        "{cache}",
        "--json",
    ],
    "where": ["where", "{base}", *_PLAN, "--doc", "1", "--steps", "0:5", "--json"],
    "stats": ["stats", "{base}", *_PLAN, "--step", "3", "--json"],
    "erase": ["erase", "{copy}", "--doc", "2", "--json"],
}


def _fill(argv: list[str], values: dict) -> list[str]:
    out: list[str] = []
    for a in argv:
        out += values["base"] if a == "{base}" else [a.format(**{k: v for k, v in values.items() if k != "base"})]
    return out


def test_every_subcommand_with_json_is_listed():
    """The cases cover every subcommand that takes ``--json`` (a new one must be added to CASES)."""
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices
    with_json = {name for name, p in sub.items() if any(a.dest == "json" for a in p._actions)}
    assert with_json == {case.split()[0] for case in CASES}


@pytest.mark.parametrize("case", list(CASES))
def test_json_stdout_is_exactly_one_document(case, capfd, cache_root, small_index, small_tokenizer, tmp_path):
    """Issue 31 (leftover): `build --layout --json` printed the layout's rows before the JSON, `build --sharded --json`
    printed rows and no JSON at all; with ``--json`` every human line goes to stderr and stdout parses as one JSON
    document (``json.loads(stdout)``, as ``| python -m json.tool`` reads it)."""
    texts = tmp_path / "texts"
    texts.mkdir()
    for k in range(2):
        (texts / f"{k}.txt").write_text(f"text {k} " * 200)
    copy = copy_with_layouts(small_index, tmp_path / "copy", []).path if case == "erase" else ""
    values = {
        "base": ["--max-documents", "16", "--tokenizer", small_tokenizer.path, "--cache-dir", str(cache_root)],
        "texts": str(texts),
        "cache": str(tmp_path / "cache"),
        "copy": str(copy),
        "tok": str(small_tokenizer.path),
    }
    if case == "build --finalize":  # the shards built first, without --json
        assert main(_fill(CASES["build --sharded"][:-1], values)) == 0
        capfd.readouterr()
    code = main(_fill(CASES[case], values))
    out = capfd.readouterr().out
    assert code == 0
    doc = json.loads(out)  # exactly one document: anything before or after it fails here
    assert isinstance(doc, dict) and doc
    if "--layout" in case:  # what the rows said (now on stderr) is in the document
        assert doc["layout"]["num_samples"] > 0
    if "sharded" in case or "finalize" in case:
        assert doc["manifest"]["num_shards"] == 2 and doc["path"] == doc["manifest"]["path"]
    if "--shard 0" in case:
        assert doc["shards_built"] == [0] and doc["manifest"] is None  # shard 1 not built: no manifest yet
