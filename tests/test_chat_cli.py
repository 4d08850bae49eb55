"""The CLI over chat data: ``build --loss-policy``, ``stats`` counting trained and masked tokens, ``show`` naming each
span's trained tokens, stored or rendered on the fly."""

from __future__ import annotations

import json

import numpy as np
import pytest

from detsampler.cli import main
from tests.chat_data import conversations, make_chat_tokenizer


@pytest.fixture(scope="module")
def chat_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("chat-cli")
    make_chat_tokenizer(root / "tok")
    with open(root / "chat.jsonl", "w") as f:
        for c in conversations(30, seed=3):
            f.write(json.dumps({"messages": c}) + "\n")
    return root


def _args(root, *extra):
    return [
        "--data", str(root / "chat.jsonl"), "--text-column", "messages", "--tokenizer", str(root / "tok"),
        "--loss-policy", "assistant", "--cache-dir", str(root / "cache"), "--quiet", *extra,
    ]  # fmt: skip


def _run(capsys, argv) -> str:
    assert main(argv) == 0
    return capsys.readouterr().out


def test_build_stats_and_show_count_the_trained_tokens(capsys, chat_files):
    from detsampler.index import TokenIndex

    summary = json.loads(_run(capsys, ["build", *_args(chat_files), "--json"]))
    index = TokenIndex.open(summary["path"])
    trained = int(np.asarray(index.loss_mask).sum())  # the EOS is not trained under "assistant"
    assert summary["loss_mask"] == {
        "policy": "assistant",
        "trained_tokens": trained,
        "masked_tokens": index.num_tokens + index.num_documents - trained,
    }
    layout = ["--kind", "bestfit", "--seq-len", "256", "--global-batch-size", "4", "--micro-batch-size", "2"]
    stats = json.loads(_run(capsys, ["stats", *_args(chat_files, *layout[2:], "--kinds", "bestfit", "--json")]))
    assert stats["loss_mask"] == summary["loss_mask"]
    assert "loss mask            policy assistant: " in _run(capsys, ["build", *_args(chat_files)])
    show = _run(capsys, ["show", *_args(chat_files, *layout, "--step", "0")])
    lines = show.splitlines()
    # each span line is followed by its trained ranges, equal to the stored mask over the span's positions
    for i, line in enumerate(lines):
        if line.startswith("    doc "):
            doc = int(line.split()[1])
            start, stop = (int(x) for x in line.split("tokens [")[1].split(")")[0].split(", "))
            stop += "+ EOS" in line
            mask = np.asarray(index.loss_mask[index.offsets[doc] + start : index.offsets[doc] + stop])
            mask = np.pad(mask, (0, stop - start - mask.size))  # the virtual EOS: not trained
            assert lines[i + 1].startswith(f"      trained {int(mask.sum())} of {stop - start} tokens: [")
    on_the_fly = _run(capsys, ["show", *_args(chat_files, *layout, "--step", "0", "--decode", "--no-store-tokens")])
    stored = _run(capsys, ["show", *_args(chat_files, *layout, "--step", "0", "--decode")])
    assert on_the_fly == stored and "trained " in stored


def test_a_policy_the_data_cannot_have_is_one_line(capsys, chat_files):
    argv = ["build", *_args(chat_files), "--loss-policy", "completion"]  # the last --loss-policy wins
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1
    assert "allowed policies for a messages column are assistant, last_turn, all" in err


def test_a_sharded_build_of_chat_data_is_refused(capsys, chat_files):
    with pytest.raises(SystemExit) as exc:
        main(["build", *_args(chat_files), "--shard", "0", "--num-shards", "2"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--loss-policy (chat data) is not supported by a sharded build" in err
    assert not list((chat_files / "cache").glob("sharded-*"))


def test_a_loss_policy_over_a_pre_tokenized_source_is_refused(capsys, tmp_path):
    np.array([5, 6, 7, 8, 7], dtype=np.uint32).tofile(tmp_path / "part.npy")
    argv = ["stats", "--data", f"olmo:{tmp_path / 'part.npy'}", "--tokenizer", "unused", "--loss-policy", "all"]
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--cache-dir", str(tmp_path / "cache"), "--quiet"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "is read as stored, not rendered from chat rows" in err


def test_a_chat_index_built_into_a_bucket_keeps_its_loss_mask_and_its_own_key(
    capsys, chat_files, s3_bucket, tmp_path, monkeypatch
):
    """``build --cache-dir s3://`` of chat data pushes the index with its mask, under the chat key: the same key (and
    the same mask) as the local build, never the plain-text index of the same rows."""
    from detsampler.index import TokenIndex

    monkeypatch.setenv("DETSAMPLER_CACHE", str(tmp_path / "staging"))
    argv = [*_args(chat_files)[:-3], "--cache-dir", f"{s3_bucket}/cache", "--quiet", "--json"]
    remote = json.loads(_run(capsys, ["build", *argv]))
    local = json.loads(_run(capsys, ["build", *_args(chat_files), "--json"]))
    assert remote["path"].rsplit("/", 1)[-1] == local["path"].rsplit("/", 1)[-1]
    assert remote["loss_mask"] == local["loss_mask"]
    mask = np.asarray(TokenIndex.open(remote["path"]).loss_mask)
    assert np.array_equal(mask, np.asarray(TokenIndex.open(local["path"]).loss_mask))


@pytest.mark.parametrize("stored", [True, False], ids=["stored", "on-the-fly"])
def test_show_says_a_redacted_documents_labels_are_not_trained(capsys, chat_files, stored):
    """Issue 31 (re-run): `show --redact 0:D` printed `trained 37 of 61 tokens` for document D at a step that masks
    every label of it (the trainer's redact_labels): the trained tokens ignored the redactions. A redacted span now says
    so and trains none; the other spans are printed as without the redaction, and so is D before its step."""
    layout = ["--kind", "bestfit", "--seq-len", "256", "--global-batch-size", "4", "--micro-batch-size", "2"]
    base = _args(chat_files, *layout, *([] if stored else ["--no-store-tokens"]))
    plain = _run(capsys, ["show", *base, "--step", "1"]).splitlines()
    doc = next(int(line.split()[1]) for line in plain if line.startswith("    doc "))
    redacted = _run(capsys, ["show", *base, "--step", "1", "--redact", f"1:{doc}"]).splitlines()
    before = _run(capsys, ["show", *base, "--step", "1", "--redact", f"2:{doc}"]).splitlines()
    assert before == plain
    assert len(redacted) == len(plain)
    changed = [(a, b) for a, b in zip(plain, redacted) if a != b]
    assert changed and all(a.startswith(("    doc ", "      trained ")) for a, _ in changed)
    spans = [i for i, line in enumerate(plain) if line.startswith("    doc ")]
    assert all(plain[i + 1].startswith("      trained ") for i in spans)
    for i in spans:
        if plain[i].startswith(f"    doc {doc} "):
            start, stop = (int(x) for x in plain[i].split("tokens [")[1].split(")")[0].split(", "))
            n = stop - start + ("+ EOS" in plain[i])
            assert redacted[i] == plain[i] + "  redacted from step 1"
            assert redacted[i + 1] == f"      trained 0 of {n} tokens: none (its labels are masked: redacted)"
        else:
            assert redacted[i : i + 2] == plain[i : i + 2]
