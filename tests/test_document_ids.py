"""Documents named the way takedowns arrive (issue 32, item 2): by a value of any id column the dataset has
(``documents_by_id``; ``where --id-column C --id X``; the trainer's ``{id_column = C, ids = [...]}`` redactions), equal
to naming them by document id; and the small audit faults of item 5 (``where --checkpoint`` asking for the text column
its index records, ``stats --kinds bestfit --overlong truncate`` refused without ``--kind bestfit``)."""

from __future__ import annotations

import json

import datasets
import pytest

from detsampler.cli import main
from detsampler.content import documents_by_id
from detsampler.index.prepare import IndexConfig, prepare_index
from detsampler.layout import LayoutConfig
from detsampler.plan import Plan
from detsampler.record import DataRecord
from tests.chat_data import conversations, make_chat_tokenizer


def chat_rows(num: int = 12) -> list[dict]:
    """A JSON-lines chat corpus as SFT teams keep it: a ``conversation_id`` (a string), a numeric ``ticket`` and
    ``messages``."""
    return [
        {"conversation_id": f"c-{100 + i}", "ticket": 7000 + i, "messages": m}
        for i, m in enumerate(conversations(num, seed=4))
    ]


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    root = tmp_path_factory.mktemp("chat-ids")
    make_chat_tokenizer(root / "tok")
    with open(root / "chat.jsonl", "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in chat_rows())
    return root


def test_documents_by_id_names_the_rows_whose_id_column_holds_the_ids():
    ds = datasets.Dataset.from_list(chat_rows())
    assert documents_by_id(ds, "conversation_id", ["c-105", "c-103"]) == [3, 5]
    assert documents_by_id(ds, "ticket", [7004]) == documents_by_id(ds, "ticket", ["7004"]) == [4]  # as typed at a CLI
    twice = datasets.Dataset.from_dict({"id": ["a", "b", "a", None]})
    assert documents_by_id(twice, "id", ["a"]) == [0, 2]  # every row the id names; a null id names nothing


def test_what_an_id_lookup_cannot_answer_is_refused_in_one_line():
    ds = datasets.Dataset.from_list(chat_rows())
    cases = [
        (ds, "conversation_id", ["c-999", "c-100"], "ids ['c-999'] name no document of the index's dataset"),
        (ds, "conversation", ["c-100"], "the dataset has no column 'conversation' (its columns: ['conversation_id', "),
        (datasets.Dataset.from_dict({"id": [0.5, 1.5]}), "id", ["0.5"], "row 0: column 'id' holds float"),
        (ds, "conversation_id", "c-100", "ids must be a list of strings or integers"),
        (ds, "conversation_id", [], "ids must be a list of strings or integers"),
        (ds, "conversation_id", [True], "ids must be a list of strings or integers"),
    ]
    for dataset, column, ids, message in cases:
        with pytest.raises(ValueError) as e:
            documents_by_id(dataset, column, ids)
        assert message in str(e.value) and "\n" not in str(e.value), str(e.value)


def _where(chat, capsys, *pick: str, code: int = 0) -> dict | str:
    argv = ["where", "--data", str(chat / "chat.jsonl"), "--text-column", "messages", "--tokenizer", str(chat / "tok")]
    argv += ["--loss-policy", "assistant", "--cache-dir", str(chat / "cache"), "--quiet", "--kind", "bestfit"]
    argv += ["--seq-len", "256", "--global-batch-size", "4", "--steps", "0:40", "--json", *pick]
    if code:
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == code
        return capsys.readouterr().err
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_where_finds_a_conversation_by_its_id(chat, capsys):
    by_doc = _where(chat, capsys, "--doc", "5")
    assert by_doc["reads"]
    assert _where(chat, capsys, "--id-column", "conversation_id", "--id", "c-105") == by_doc
    assert _where(chat, capsys, "--id-column", "ticket", "--id", "7005") == by_doc
    for pick, message in [
        (["--id-column", "conversation_id", "--id", "c-1"], "ids ['c-1'] name no document"),
        (["--id", "c-105"], "--id needs --id-column (the dataset's column that holds the ids)"),
        (["--id-column", "conversation_id"], "--id-column needs --id"),
        (["--id-column", "conversation_id", "--id", "c-105", "--doc", "5"], "where needs one of --doc ID, --path"),
    ]:
        err = _where(chat, capsys, *pick, code=2)
        assert message in err and err.count("\n") == 1, (pick, err)


def test_where_checkpoint_reads_the_text_column_its_index_records(chat, capsys, tmp_path):
    """Was: ``where --checkpoint DIR --data chat.jsonl --sha256 ...`` refused ``index ... was built from column
    'messages', got text_column 'text'`` unless ``--text-column messages`` was typed again."""
    config = IndexConfig(
        data=str(chat / "chat.jsonl"),
        text_column="messages",
        tokenizer=str(chat / "tok"),
        cache_dir=str(chat / "cache"),
        loss_policy="assistant",
    )
    index = prepare_index(config).index
    layout = index.layout(LayoutConfig(kind="bestfit", seq_len=256))
    plan = Plan(layout.num_samples, seed=0, global_batch_size=4, micro_batch_size=2)
    DataRecord.of(40, index, layout, plan, framework="hf").save(tmp_path)
    argv = ["where", "--checkpoint", str(tmp_path), "--data", str(chat / "chat.jsonl"), "--json", "--quiet"]
    assert main([*argv, "--id-column", "conversation_id", "--id", "c-105"]) == 0
    by_id = json.loads(capsys.readouterr().out)
    assert main([*argv, "--doc", "5"]) == 0
    assert json.loads(capsys.readouterr().out) == by_id and by_id["reads"]


def test_stats_of_bestfit_alone_takes_its_overlong_policy(capsys, small_tokenizer, cache_root):
    """Was: ``stats --kinds bestfit --overlong truncate --redact 3:5`` refused (the audit trail's layout was built from
    the default ``--kind concat``, which takes no ``--overlong``), although bestfit is the only kind asked."""
    base = ["--max-documents", "300", "--tokenizer", small_tokenizer.path, "--cache-dir", str(cache_root), "--quiet"]
    argv = ["stats", *base, "--seq-len", "256", "--global-batch-size", "8", "--json", "--kinds", "bestfit"]
    argv += ["--redact", "3:5", "--step", "10"]
    assert main([*argv, "--overlong", "truncate"]) == 0
    truncated = json.loads(capsys.readouterr().out)
    assert main([*argv, "--kind", "bestfit", "--overlong", "truncate"]) == 0
    assert json.loads(capsys.readouterr().out) == truncated and truncated["redactions"][0]["document"] == 5
    assert main(argv) == 0
    split = json.loads(capsys.readouterr().out)
    assert truncated["layouts"]["bestfit"] != split["layouts"]["bestfit"]  # the policy was applied
    with pytest.raises(SystemExit) as exc:  # a --kind given is the audit's, and concat takes no --overlong
        main([*argv, "--kind", "concat", "--overlong", "truncate"])
    assert exc.value.code == 2 and "applies to the bestfit layout only" in capsys.readouterr().err


def test_the_trainer_redacts_a_conversation_named_by_its_id():
    from detsampler.redaction import Redaction
    from tests.test_train_units import CONFIGS, load_config
    from train.data import resolve_redactions

    ds = datasets.Dataset.from_list(chat_rows(6))
    entry = '{id_column = "conversation_id", ids = ["c-104", "c-101"], from_step = 2}'
    cfg = load_config(CONFIGS / "sft.toml", [f"data.redactions=[{entry}]"])
    assert resolve_redactions(cfg.data, ds) == [Redaction([1, 4], 2)]
    both = '{id_column = "ticket", ids = [7003], documents = [0], from_step = 3}'
    cfg = load_config(CONFIGS / "sft.toml", [f"data.redactions=[{both}]"])
    assert resolve_redactions(cfg.data, ds) == [Redaction([0, 3], 3)]
    for entry, message in [
        ('{ids = ["c-104"], from_step = 2}', "DataConfig.redactions[0].ids needs id_column"),
        ('{id_column = "conversation_id", from_step = 2}', "DataConfig.redactions[0].id_column needs ids"),
        ('{id_column = "conversation_id", ids = [1.5], from_step = 2}', "ids must be a list of strings or integers"),
    ]:
        with pytest.raises(ValueError) as e:
            load_config(CONFIGS / "sft.toml", [f"data.redactions=[{entry}]"])
        assert message in str(e.value), str(e.value)
    cfg = load_config(CONFIGS / "sft.toml", ['data.redactions=[{id_column = "user", ids = ["u"], from_step = 2}]'])
    with pytest.raises(ValueError, match=r"from step 2: the dataset has no column 'user'"):
        resolve_redactions(cfg.data, ds)
