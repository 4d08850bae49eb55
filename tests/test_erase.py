"""Erasure that moves nothing (issue 32, item 3): ``erase_documents`` overwrites the erased documents' stored tokens
(and loss mask) in place with the pad id, locally and in a bucket (moto's S3), keeps every length and so every sample,
recomputes only the touched chunks' checksums and appends an erasure record to the index's identity; a run's
fingerprint check accepts exactly that extension; the erased documents are never trained again (labels masked,
inputs neutral) in any layout, and every other sample's bytes and labels are unchanged. Before it, the only way to erase
stored tokens was a rebuild, which names another index (every sample moved: the run could not resume)."""

from __future__ import annotations

import io
import json
import shutil

import numpy as np
import pytest
import torch

from detsampler import LayoutConfig, PackedDataset, Plan
from detsampler.index import TokenIndex
from detsampler.index.erase import erase_documents, erasure_proof
from detsampler.index.format import ERASED_FORMAT_VERSION, ERASURE_JOURNAL, TokenIndexError
from detsampler.resume import DataFingerprint, check_resume

ERASED = [3, 7]
KINDS = ["concat", "document", "bestfit"]


@pytest.fixture
def copy(small_index, tmp_path):
    dest = tmp_path / small_index.path.name
    shutil.copytree(small_index.path, dest, ignore=shutil.ignore_patterns("layouts", "*.lock", ".verified-*"))
    return dest


def expected(before: PackedDataset, ids, erased, pad: int, concat: bool) -> dict:
    """The batch ``before`` (unerased) reads, as it must read once ``erased`` are: their input tokens the pad id, every
    label at their positions -100, and (concat) every label whose target is theirs -100; worked out from the batch."""
    batch = before.get_batch(ids)
    docs = batch["document_ids"]
    hit = torch.from_numpy(np.isin(docs.numpy(), erased))
    eos_position = batch["input_ids"] == before.index.eos_id  # the virtual EOS each document ends with: structural
    batch["input_ids"] = torch.where(hit & ~eos_position, pad, batch["input_ids"])
    labels = batch["labels"].masked_fill(hit, -100)
    if concat:  # the target of position t is position t + 1's token; the last one's is the window's extra token
        spans = before.layout.locate(np.asarray(ids))
        last = torch.as_tensor(spans.doc_ids[spans.offsets[1:] - 1])
        following = torch.cat([docs[:, 1:], last[:, None]], dim=1)
        labels = labels.masked_fill(torch.from_numpy(np.isin(following.numpy(), erased)), -100)
    batch["labels"] = labels
    return batch


def test_an_erasure_overwrites_the_stored_tokens_and_moves_nothing_else(copy):
    original = TokenIndex.open(copy)
    raw = {name: (copy / name).read_bytes() for name in ("tokens.npy", "lengths.npy", "offsets.npy")}
    layouts = {kind: original.layout(LayoutConfig(kind=kind, seq_len=64)) for kind in KINDS}
    before = {kind: PackedDataset(original, layouts[kind]) for kind in KINDS}
    unerased = {kind: before[kind].get_batch(list(range(len(before[kind])))) for kind in KINDS}
    plan = Plan(len(before["bestfit"]), seed=0, global_batch_size=8, micro_batch_size=2)
    saved = DataFingerprint.of(original, layouts["bestfit"], plan)

    result = erase_documents(copy, ERASED)
    index = TokenIndex.open(copy, verify_tokens=True)  # every chunk and every file's sha256, as recomputed
    assert result["documents"] == ERASED and index.meta["format_version"] == ERASED_FORMAT_VERSION
    assert index.erased_documents.tolist() == ERASED and index.fingerprint == original.fingerprint
    assert index.data_identity == f"{original.fingerprint}+erasure:{result['record']['id']}" == result["identity"]
    # the bytes: the erased documents' tokens are the pad id, every other byte of every file as it was
    tokens = np.load(copy / "tokens.npy")
    want = np.load(io.BytesIO(raw["tokens.npy"]))
    for d in ERASED:
        a, b = int(index.offsets[d]), int(index.offsets[d] + index.lengths[d])
        assert (tokens[a:b] == index.pad_id).all() and (want[a:b] != index.pad_id).any()
        want[a:b] = index.pad_id
    assert np.array_equal(tokens, want)
    assert all((copy / name).read_bytes() == raw[name] for name in ("lengths.npy", "offsets.npy"))
    assert [p["neutral"] == p["num_tokens"] for p in erasure_proof(index)] == [True, True]
    # every sample in place: the layouts are the same, each batch is the unerased one but the erased documents
    for kind in KINDS:
        after = PackedDataset(index, index.layout(LayoutConfig(kind=kind, seq_len=64)))
        ids = list(range(len(after)))
        assert len(after) == len(before[kind])
        got, want_batch = after.get_batch(ids), expected(before[kind], ids, ERASED, index.pad_id, kind == "concat")
        for key in want_batch:
            assert torch.equal(got[key], want_batch[key]), (kind, key)
        touched = torch.from_numpy(np.isin(unerased[kind]["document_ids"].numpy(), ERASED)).any(1)
        for key in want_batch:  # the samples holding no erased document are byte for byte the same
            assert torch.equal(got[key][~touched], unerased[kind][key][~touched]), (kind, key)
        assert touched.any(), kind
    # a run resumes across it: exactly the erasure is accepted
    now = DataFingerprint.of(index, index.layout(LayoutConfig(kind="bestfit", seq_len=64)), plan)
    assert now.index != saved.index and now.hash != saved.hash
    check_resume(saved, now, 5)
    with pytest.raises(ValueError, match="changes the index"):
        check_resume(now, saved, 5)  # an erasure removed (a copy from before it): refused
    with pytest.raises(ValueError, match="changes the index"):
        check_resume(saved, DataFingerprint("another-index+erasure:00", now.layout, now.plan), 5)


def test_erasing_again_is_a_no_op_and_a_second_erasure_extends_the_identity(copy):
    first = erase_documents(copy, [3])
    assert erase_documents(copy, [3])["documents"] == [] and erase_documents(copy, [3])["already"] == [3]
    second = erase_documents(copy, [3, 9])
    index = TokenIndex.open(copy, verify_tokens=True)
    assert second["documents"] == [9] and index.erased_documents.tolist() == [3, 9]
    ids = f"+erasure:{first['record']['id']}+erasure:{second['record']['id']}"
    assert index.data_identity == index.fingerprint + ids
    assert DataFingerprint.of(index, index.layout(LayoutConfig(kind="concat", seq_len=64)), _plan(index)).index == (
        index.data_identity
    )


def _plan(index) -> Plan:
    return Plan(index.layout(LayoutConfig(kind="concat", seq_len=64)).num_samples, seed=0, global_batch_size=4,
                micro_batch_size=4)  # fmt: skip


def test_an_interrupted_erasure_refuses_to_open_and_finishes_when_run_again(copy, monkeypatch):
    """A crash after the bytes were patched, before meta.json: the index refuses to open (never serves a byte its
    checksums do not vouch for); the same command finishes it, to the very bytes of an uninterrupted erasure."""
    import detsampler.index.erase as erase

    clean = copy.parent / "clean" / copy.name
    shutil.copytree(copy, clean)
    erase_documents(clean, ERASED)

    def crash(*args, **kwargs):
        raise KeyboardInterrupt("killed before meta.json")

    monkeypatch.setattr(erase, "put_if_unchanged", crash)
    with pytest.raises(KeyboardInterrupt):
        erase_documents(copy, ERASED)
    monkeypatch.undo()
    assert (copy / ERASURE_JOURNAL).exists()
    with pytest.raises(TokenIndexError, match="an erasure was interrupted .* run `detsampler erase` on it again"):
        TokenIndex.open(copy)
    with pytest.raises(ValueError, match="interrupted erasure of documents \\[3, 7\\] must be finished first"):
        erase_documents(copy, [9])
    assert erase_documents(copy, ERASED)["documents"] == ERASED
    assert not (copy / ERASURE_JOURNAL).exists()
    for name in ("tokens.npy", "tokens.sums.npy", "meta.json"):
        assert (copy / name).read_bytes() == (clean / name).read_bytes(), name


def test_what_cannot_be_erased_is_refused_in_one_line(copy, small_corpus, small_tokenizer, tmp_path):
    from detsampler.index import build_index

    on_the_fly = build_index(small_corpus, small_tokenizer, cache_dir=tmp_path / "fly", progress=False,
                             store_tokens=False)  # fmt: skip
    n = TokenIndex.open(copy).num_documents
    cases = [
        (copy, [n], f"Got document {n}, allowed documents are in [0, {n})"),
        (copy, [], "names no document"),
        (copy, "3", "documents must be a list of document ids"),
        (on_the_fly.path, [0], "stores no tokens"),
        (tmp_path / "nothing", [0], "no index at"),
    ]
    for path, docs, message in cases:
        with pytest.raises(ValueError) as e:
            erase_documents(path, docs)
        assert message in str(e.value) and "\n" not in str(e.value), str(e.value)
    meta = json.loads((copy / "meta.json").read_text())
    assert meta["format_version"] == 2  # nothing was written


def test_a_chat_index_loses_the_mask_and_tokens_of_an_erased_conversation(tmp_path):
    from detsampler.index import build_index
    from detsampler.text.chat import ChatConfig
    from tests.chat_data import chat_dataset, make_chat_tokenizer

    tok = make_chat_tokenizer(tmp_path / "tok")
    index = build_index(chat_dataset(30), tok, cache_dir=tmp_path / "cache", progress=False, chat=ChatConfig())
    layout = index.layout(LayoutConfig(kind="bestfit", seq_len=128))
    before = PackedDataset(index, layout).get_batch(list(range(layout.num_samples)))
    erase_documents(index.path, [4])
    index = TokenIndex.open(index.path, verify_tokens=True)
    a, b = int(index.offsets[4]), int(index.offsets[5])
    assert not np.asarray(index.loss_mask[a:b]).any() and (np.asarray(index.tokens[a:b]) == index.pad_id).all()
    after = PackedDataset(index, index.layout(LayoutConfig(kind="bestfit", seq_len=128)))
    got = after.get_batch(list(range(layout.num_samples)))
    hit = before["document_ids"] == 4
    assert hit.any() and not got["loss_mask"][hit].any() and (got["labels"][hit] == -100).all()
    assert torch.equal(got["loss_mask"][~hit], before["loss_mask"][~hit])
    assert torch.equal(got["labels"][~hit], before["labels"][~hit])
    assert erasure_proof(index)[0]["mask_zero"] is True


def test_an_erasure_in_a_bucket_equals_the_local_one(small_index, s3_bucket, tmp_path):
    """The index pushed to moto's S3, erased there: the objects are rewritten (one streamed PUT each), meta.json last
    and conditionally (a writer that changed it since it was read makes the erasure refuse, nothing replaced); the
    bucket's index reads exactly what the locally erased copy reads."""
    from detsampler.index.push import push_index
    from detsampler.storage import store_for
    from detsampler.storage.rewrite import ConflictError, put_if_unchanged

    local = tmp_path / small_index.path.name
    shutil.copytree(small_index.path, local, ignore=shutil.ignore_patterns("layouts", "*.lock", ".verified-*"))
    url = f"{s3_bucket}/erase-{tmp_path.name}/{small_index.path.name}"
    push_index(local, url)
    remote_result, local_result = erase_documents(url, ERASED), erase_documents(local, ERASED)
    assert remote_result["identity"] == local_result["identity"]
    remote, here = TokenIndex.open(url, verify_tokens=True), TokenIndex.open(local)
    assert remote.data_identity == here.data_identity and remote.erased_documents.tolist() == ERASED
    config = LayoutConfig(kind="concat", seq_len=64)
    ids = list(range(0, here.layout(config).num_samples, 7))
    got = PackedDataset(remote, remote.layout(config)).get_batch(ids)
    want = PackedDataset(here, here.layout(config)).get_batch(ids)
    assert all(torch.equal(got[k], want[k]) for k in want)
    meta = f"{url}/meta.json"
    stale = store_for(meta).version(meta)[1]
    store_for(meta).put(meta, store_for(meta).read_head(meta, -1)[0] + b"\n")  # another writer, between read and write
    with pytest.raises(ConflictError, match="changed since it was read"):
        put_if_unchanged(meta, b"{}", stale)
    assert TokenIndex.open(url).data_identity == here.data_identity  # nothing replaced


def test_the_cli_erases_and_verify_proves_the_bytes_gone_from_a_checkpoint_saved_before(copy, tmp_path, capsys):
    """``erase INDEX --doc 3,7``; ``verify --checkpoint`` of a record saved before the erasure is still audited (the
    index's identity only extends it) and reads the erased bytes back: all the pad id."""
    from detsampler.cli import main
    from detsampler.record import DataRecord

    index = TokenIndex.open(copy)
    layout = index.layout(LayoutConfig(kind="bestfit", seq_len=64))
    plan = Plan(layout.num_samples, seed=0, global_batch_size=8, micro_batch_size=4)
    (tmp_path / "ckpt").mkdir()
    DataRecord.of(6, index, layout, plan, framework="hf").save(tmp_path / "ckpt")
    assert main(["erase", str(copy), "--doc", "3,7", "--doc", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"erased 2 document(s) [3, 7] of {copy}: ") and "with the pad id" in out[0]
    assert out[1].startswith(f"index identity {index.fingerprint}+erasure:")
    assert out[2].startswith("erased doc 3 (erasure ") and out[2].endswith(": its bytes are gone")
    assert main(["verify", "--checkpoint", str(tmp_path / "ckpt")]) == 0
    out = capsys.readouterr().out
    assert "erased doc 7 (erasure " in out and out.rstrip().endswith("OK: no duplicates, no gaps")
    with pytest.raises(SystemExit) as exc:
        main(["erase", str(copy), "--doc", "x"])
    assert exc.value.code == 2 and "expected document ids" in capsys.readouterr().err


@pytest.mark.parametrize("kind", KINDS)
def test_the_audit_still_counts_what_each_read_trained_once_the_bytes_are_gone(copy, tmp_path, kind):
    """The labels an erased document's earlier reads trained, counted after its erasure (from the layout and, for chat
    data, its recorded trained positions), equal the count over the batches read before it, plain text and chat."""
    from detsampler.index import build_index
    from detsampler.loader.redact import trained_labels
    from detsampler.text.chat import ChatConfig
    from detsampler.where import where
    from tests.chat_data import chat_dataset, make_chat_tokenizer

    tok = make_chat_tokenizer(tmp_path / "tok")
    chat = build_index(chat_dataset(40), tok, cache_dir=tmp_path / "chat", progress=False, chat=ChatConfig()).path
    for path, docs, seq_len in ((copy, ERASED, 64), (chat, [4, 9], 128)):
        index = TokenIndex.open(path)
        layout = index.layout(LayoutConfig(kind=kind, seq_len=seq_len))
        plan = Plan(layout.num_samples, seed=1, global_batch_size=8, micro_batch_size=8)
        reads = {d: where(plan, layout, d, (0, 3 * layout.num_samples // 8)) for d in docs}
        before = {d: trained_labels(PackedDataset(index, layout), reads[d], d) for d in docs}
        erase_documents(path, docs)
        index = TokenIndex.open(path)
        dataset = PackedDataset(index, index.layout(LayoutConfig(kind=kind, seq_len=seq_len)))
        assert {d: trained_labels(dataset, reads[d], d) for d in docs} == before and all(before.values()), path
        from detsampler.filter import RepetitionFilter

        filtered = PackedDataset(index, dataset.layout, instance_filter=RepetitionFilter())
        assert trained_labels(filtered, reads[docs[0]], docs[0]) is None  # earlier flags read the erased tokens


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_a_proof_that_reads_back_other_bytes_fails_the_command_in_text_and_in_json(copy, monkeypatch, capsys, as_json):
    """The exit status says whether the bytes are gone, whatever the output format: a proof row whose read-back holds a
    token other than the neutral id (here one, as a store that kept an old copy of a chunk would) exits 1 in both."""
    import detsampler.cli.erase as cli_erase
    from detsampler.cli import main

    real = cli_erase.erasure_proof

    def one_token_not_neutral(index):
        rows = real(index)
        rows[0] = {**rows[0], "neutral": rows[0]["neutral"] - 1}
        return rows

    monkeypatch.setattr(cli_erase, "erasure_proof", one_token_not_neutral)
    assert main(["erase", str(copy), "--doc", "3", *(["--json"] if as_json else [])]) == 1
    out = capsys.readouterr().out
    if as_json:
        report = json.loads(out)
        assert report["bytes_gone"] is False and report["documents"] == [3]
    else:
        assert out.rstrip().endswith("NOT ERASED")
