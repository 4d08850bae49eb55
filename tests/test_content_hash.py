"""Content hashes of every column kind (issue 31): a text column's document is named by the sha256 of its UTF-8 text (as
since issue 24), a chat row's by the sha256 of the canonical JSON of its rendered columns, computed here by the recipe
docs/design.md gives (and by ``jq``, as docs/cli.md shows), through the API, ``where --sha256`` and the trainer's
``sha256 = [...]`` redactions (tests/test_train_units.py); anything else is refused in one line."""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import subprocess

import datasets
import pytest

from detsampler.cli import main
from detsampler.content import canonical_json, content_columns, content_hash, documents_by_content
from detsampler.index.prepare import IndexConfig, load_dataset_for
from detsampler.text.chat import ChatConfig
from tests.chat_data import conversations, make_chat_tokenizer


def _without_nulls(value):
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def row_sha256(row: dict) -> str:
    """docs/design.md's recipe, written out: sha256 of the row's JSON, nulls left out, keys sorted, no spaces, UTF-8."""
    text = json.dumps(_without_nulls(row), sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def chat_rows(num: int = 12) -> list[dict]:
    """Rows of a JSON-lines chat corpus: an ``id`` beside ``messages`` (not rendered: not in the hash), one message with
    a key the others lack, and one with non-ASCII text, a quote, a tab and a newline."""
    rows = [{"id": i, "messages": c} for i, c in enumerate(conversations(num, seed=4))]
    rows[3]["messages"][0]["name"] = "alice"
    rows[5]["messages"][-1]["content"] = 'café ✓ "quoted"\tand\na new line'
    return rows


@pytest.fixture(scope="module")
def chat_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("chat-hash")
    make_chat_tokenizer(root / "tok")
    with open(root / "chat.jsonl", "w") as f:
        f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in chat_rows())
    prompts = [{"prompt": c[-2]["content"] + "\n", "completion": c[-1]["content"]} for c in conversations(8, seed=5)]
    with open(root / "prompts.jsonl", "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in prompts)
    return root


def test_a_text_keeps_its_hash_and_a_row_hashes_its_canonical_json():
    assert content_hash("gamma é") == hashlib.sha256("gamma é".encode()).hexdigest()  # issue 24's hashes unchanged
    row = {"messages": [{"role": "user", "content": "é", "name": None}, {"content": "b", "role": "assistant"}]}
    want = '{"messages":[{"content":"é","role":"user"},{"content":"b","role":"assistant"}]}'
    assert canonical_json(row) == want.encode("utf-8")
    assert content_hash(row) == row_sha256(row)
    assert content_columns("messages", ChatConfig()) == ("messages",)
    assert content_columns("prompt", ChatConfig(column="prompt", completion_column="completion", policy="all")) == (
        "prompt",
        "completion",
    )
    assert content_columns("text", None) == "text"  # a text column: its text, not a row


def test_a_chat_row_has_one_hash_however_datasets_holds_it(chat_files):
    """The JSON loader keeps each message's keys as written; ``Dataset.from_list`` (and parquet) give every message
    the union of the keys, null where one lacks it: leaving nulls out makes both the hash of the file's row."""
    rows = chat_rows()
    loaded = load_dataset_for(IndexConfig(data=str(chat_files / "chat.jsonl"), text_column="messages"))
    listed = datasets.Dataset.from_list(rows)
    assert listed[0]["messages"][0].get("name", "absent") is None and "name" not in loaded[0]["messages"][0]
    hashes = [row_sha256({"messages": row["messages"]}) for row in rows]
    for dataset in (loaded, listed):
        assert documents_by_content(dataset, hashes[3:6], ("messages",)) == [3, 4, 5]
        assert documents_by_content(dataset, [hashes[0].upper()], ("messages",)) == [0]


def test_what_a_content_hash_cannot_cover_is_refused_in_one_line():
    texts = datasets.Dataset.from_dict({"text": ["a", None, "c"]})
    cases = [
        (texts, "text", "document 1: column 'text' holds None, not a text (str)"),
        (datasets.Dataset.from_dict({"text": [1, 2]}), "text", "document 0: column 'text' holds int, not a text (str)"),
        (datasets.Dataset.from_dict({"x": [{"v": math.nan}]}), ("x",), "document 0: its row cannot be written as JSON"),
        (texts, ("messages",), "the dataset has no column 'messages' (its columns: ['text'])"),
    ]
    for dataset, columns, message in cases:
        with pytest.raises(ValueError) as e:
            documents_by_content(dataset, [hashlib.sha256(b"a").hexdigest()], columns)
        assert message in str(e.value) and "\n" not in str(e.value), str(e.value)


def _where(chat_files, capsys, data: str, column: list[str], policy: str, *pick: str) -> dict:
    argv = ["where", "--data", str(chat_files / data), *column, "--tokenizer", str(chat_files / "tok")]
    argv += ["--loss-policy", policy, "--cache-dir", str(chat_files / "cache"), "--quiet", "--kind", "bestfit"]
    argv += ["--seq-len", "256", "--global-batch-size", "4", "--steps", "0:40", "--json", *pick]
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_where_finds_a_chat_document_by_the_hash_of_its_row(chat_files, capsys):
    """Was: ``AttributeError: 'list' object has no attribute 'encode'``."""
    rows = chat_rows()
    column = ["--text-column", "messages"]
    for doc in (3, 5):
        by_id = _where(chat_files, capsys, "chat.jsonl", column, "assistant", "--doc", str(doc))
        sha = row_sha256({"messages": rows[doc]["messages"]})  # the row's rendered column only: not its id
        by_hash = _where(chat_files, capsys, "chat.jsonl", column, "assistant", "--sha256", sha)
        assert by_hash == by_id and by_id["reads"], doc
    column = ["--text-column", "prompt", "--completion-column", "completion"]
    prompt = json.loads((chat_files / "prompts.jsonl").read_text().splitlines()[2])
    by_id = _where(chat_files, capsys, "prompts.jsonl", column, "completion", "--doc", "2")
    assert _where(chat_files, capsys, "prompts.jsonl", column, "completion", "--sha256", row_sha256(prompt)) == by_id
    text_of_a_message = hashlib.sha256(rows[5]["messages"][0]["content"].encode()).hexdigest()
    with pytest.raises(SystemExit) as exc:
        _where(chat_files, capsys, "chat.jsonl", column[:1] + ["messages"], "assistant", "--sha256", text_of_a_message)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "name no document" in err and "canonical JSON" in err and err.count("\n") == 1


@pytest.mark.skipif(shutil.which("jq") is None, reason="needs jq")
def test_jq_computes_the_same_hash_as_docs_cli_md_shows(chat_files):
    """docs/cli.md: ``jq -cjS '{messages} | del(.. | nulls)'`` on a line of the corpus, piped to ``sha256sum``."""
    for i, line in enumerate((chat_files / "chat.jsonl").read_text().splitlines()):
        out = subprocess.run(
            ["jq", "-cjS", "{messages} | del(.. | nulls)"], input=line.encode(), capture_output=True, check=True
        ).stdout
        assert hashlib.sha256(out).hexdigest() == row_sha256({"messages": chat_rows()[i]["messages"]}), i
