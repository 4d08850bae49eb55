"""Pre-tokenized loss masks opened as they are: datatrove's ``.loss`` files (written by its own ``DocumentTokenizer``
with ``save_loss_metadata=True`` and per-document ``no_loss_ranges``) and OLMo-core's label masks (raw bool arrays
read by its own ``load_array_slice``), through a layout and ``PackedDataset``: each document's labels are -100 exactly
where the peer's mask says the token is not trained."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from detsampler import LayoutConfig
from detsampler.index.format import TokenIndexError
from detsampler.index.sources import open_source
from detsampler.layout import LAYOUT_KINDS
from detsampler.loader.dataset import PackedDataset


def _per_document(source, kind: str) -> dict[int, tuple[list[int], list[bool]]]:
    """Each document's positions read through a layout of ``kind`` (document layout: one document per sample, whole):
    its input ids and the loss mask of each position."""
    seq_len = int(np.max(source.lengths)) + 1
    layout = source.layout(LayoutConfig(kind=kind, seq_len=seq_len))
    batch = PackedDataset(source, layout).get_batch(np.arange(layout.num_samples))
    assert bool((batch["loss_mask"] == (batch["labels"] != -100)).all())
    out: dict[int, tuple[list[int], list[bool]]] = {}
    for row in range(len(batch["input_ids"])):
        docs = batch["document_ids"][row]
        for d in docs[docs >= 0].unique().tolist():
            at = docs == d
            ids, keep = batch["input_ids"][row][at].tolist(), batch["loss_mask"][row][at].tolist()
            prev = out.get(d, ([], []))
            out[d] = (prev[0] + ids, prev[1] + keep)
    return out


def _expected(tokens: np.ndarray, mask: np.ndarray, starts: np.ndarray, d: int) -> tuple[list[int], list[bool]]:
    """Document ``d`` as stored (its last token at its EOS position) and the loss mask of each position: the label of
    position p is token p + 1, trained when the peer's mask says so; the last position has no label."""
    ids, m = tokens[starts[d] : starts[d + 1]], mask[starts[d] : starts[d + 1]].astype(bool)
    return ids.tolist(), [*m[1:].tolist(), False]


def test_datatrove_loss_files_mask_the_labels(tmp_path, small_corpus):
    pytest.importorskip("datatrove")
    from datatrove.data import Document
    from datatrove.pipeline.tokens import DocumentTokenizer

    from detsampler.text.hf import train_hf_bpe

    tok = train_hf_bpe(small_corpus["text"], 400, tmp_path / "tok")
    pairs = [(f"Question {i}: what is {i} + {i}?\n", f"It is {2 * i}.") for i in range(40)]
    docs = [
        Document(text=q + a, id=str(i), metadata={"no_loss_ranges": [(0, len(q))]}) for i, (q, a) in enumerate(pairs)
    ]
    out = tmp_path / "tokenized"
    step = DocumentTokenizer(
        str(out),
        tokenizer_name_or_path=tok.path,
        eos_token="<|endoftext|>",
        shuffle_documents=False,
        save_filename="chat",
        save_loss_metadata=True,
    )
    step.run(iter(docs), rank=0, world_size=1)
    ds_file = next(out.glob("*.ds"))
    loss_file = ds_file.with_name(ds_file.name + ".loss")
    source = open_source("datatrove", ds_file, tokenizer=tok, loss_mask=loss_file)
    plain = open_source("datatrove", ds_file, tokenizer=tok)
    assert source.fingerprint != plain.fingerprint  # a resume with and without the mask is refused
    mask = np.fromfile(loss_file, dtype=np.bool_)  # as datatrove writes it: struct "<?" per token
    assert 0 < mask.sum() < mask.size
    tokens, starts = np.asarray(source.tokens), np.asarray(source.offsets)
    for kind in LAYOUT_KINDS:
        if kind == "concat":
            continue  # windows cross documents; checked below through output="tokens"
        got = _per_document(source, kind)
        assert got == {d: _expected(tokens, mask, starts, d) for d in range(source.num_documents)}
    # what is trained is each answer and its EOS, never the prompt
    for d, (_, answer) in enumerate(pairs):
        ids, keep = got[d]
        assert tok.decode([ids[p + 1] for p in range(len(ids)) if keep[p]]) == answer + "<|endoftext|>"
    again = pickle.loads(pickle.dumps(source))  # workers reopen it with its mask
    assert again.fingerprint == source.fingerprint and again.loss_mask is not None
    concat = source.layout(LayoutConfig(kind="concat", seq_len=64))
    both = PackedDataset(source, concat, output="tokens").get_batch(np.arange(concat.num_samples))
    spans = concat.locate(np.arange(concat.num_samples))
    for i in range(concat.num_samples):  # a concat sample: its spans' stored positions, 65 of them
        cells = [mask[starts[d] + a : starts[d] + b] for d, a, b in spans.sample(i)]
        assert both["loss_mask"][i].tolist() == np.concatenate(cells)[1:].tolist()


def test_olmo_label_masks_mask_the_labels(tmp_path):
    pytest.importorskip("olmo_core")
    from olmo_core.data.utils import load_array_slice

    rng = np.random.default_rng(4)
    docs = [np.append(rng.integers(10, 1000, rng.integers(2, 60)), 7) for _ in range(50)]
    tokens = np.concatenate(docs).astype(np.uint32)
    tokens.tofile(tmp_path / "part-0.npy")
    masks = [(np.arange(len(d)) >= len(d) // 2) for d in docs]  # the second half of each document trained
    mask_path = tmp_path / "part-0.label_mask.npy"
    mm = np.memmap(mask_path, dtype=np.bool_, mode="w+", shape=(tokens.size,))  # as OLMo-core reads it: raw bool
    mm[:] = np.concatenate(masks)
    mm.flush()
    source = open_source("olmo", tmp_path / "part-0.npy", eos_id=7, loss_mask=mask_path)
    peer = load_array_slice(mask_path, 0, tokens.size, np.bool_)  # OLMo-core's own reader of label masks
    starts = np.asarray(source.offsets)
    for kind in ("document", "bestfit"):
        got = _per_document(source, kind)
        assert got == {d: _expected(tokens, peer, starts, d) for d in range(len(docs))}


def test_a_mask_of_another_size_is_refused(tmp_path):
    np.array([1, 2, 7, 3, 7], dtype=np.uint32).tofile(tmp_path / "x.npy")
    (tmp_path / "x.mask").write_bytes(b"\1" * 4)
    with pytest.raises(TokenIndexError, match=r"holds 4 bytes, not one per token \(5\)"):
        open_source("olmo", tmp_path / "x.npy", eos_id=7, loss_mask=tmp_path / "x.mask")
    with pytest.raises(TokenIndexError, match="no loss mask file"):
        open_source("olmo", tmp_path / "x.npy", eos_id=7, loss_mask=tmp_path / "missing.mask")
