"""PackedDataset: round trips against the tokenized documents, batched == per-sample reference, on-the-fly == stored,
and a resumed multi-worker DataLoader equal to the uninterrupted one."""

from __future__ import annotations

import pickle

import datasets
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from detsampler.index import TokenIndex, TokenIndexError, build_index
from detsampler.layout import LayoutConfig, make_layout
from detsampler.loader.dataset import PackedDataset, collate_micro_batch
from detsampler.loader.sampler import DeterministicBatchSampler
from detsampler.plan import Plan


def _docs_with_eos(index: TokenIndex) -> list[np.ndarray]:
    return [np.append(index.document_tokens(d).astype(np.int64), index.eos_id) for d in range(index.num_documents)]


def _all_samples(ds: PackedDataset, chunk: int = 512) -> dict[str, np.ndarray]:
    parts = [ds.get_batch(np.arange(i, min(i + chunk, len(ds)))) for i in range(0, len(ds), chunk)]
    return {k: torch.cat([p[k] for p in parts]).numpy() for k in parts[0]}


def test_concat_round_trip(small_index):
    L = 96
    layout = small_index.layout(LayoutConfig(kind="concat", seq_len=L, seed=5))
    ds = PackedDataset(small_index, layout)
    docs = _docs_with_eos(small_index)
    stream = np.concatenate([docs[d] for d in layout.order])
    out = _all_samples(ds)
    n = len(ds)
    assert out["input_ids"].reshape(-1).tolist() == stream[: n * L].tolist()
    assert np.array_equal(out["labels"], stream[1 : n * L + 1].reshape(n, L))
    assert np.array_equal(out["position_ids"], np.broadcast_to(np.arange(L), (n, L)))
    doc_of_stream = np.concatenate([np.full(len(docs[d]), d) for d in layout.order])
    assert np.array_equal(out["document_ids"].reshape(-1), doc_of_stream[: n * L])
    restart = (
        PackedDataset(small_index, layout, restart_position_ids=True).get_batch(np.arange(n))["position_ids"].numpy()
    )
    starts = out["document_ids"][:, 1:] != out["document_ids"][:, :-1]
    assert np.all(restart[:, 0] == 0) and np.all(restart[:, 1:][starts] == 0)
    assert np.all(restart[:, 1:][~starts] == restart[:, :-1][~starts] + 1)


@pytest.mark.parametrize("kind", ["document", "bestfit"])
def test_every_document_token_appears_exactly_once(small_index, kind):
    L = 80
    layout = small_index.layout(LayoutConfig(kind=kind, seq_len=L, seed=1, window_docs=6))
    ds = PackedDataset(small_index, layout)
    out = _all_samples(ds)
    valid = out["document_ids"] >= 0
    docs = out["document_ids"][valid]
    spans = layout.locate(np.arange(len(ds)))
    g_pos = np.concatenate([np.arange(s, e) for s, e in zip(spans.starts, spans.stops)])
    order = np.lexsort((g_pos, docs))
    docs_with_eos = _docs_with_eos(small_index)
    assert np.array_equal(docs[order], np.repeat(np.arange(small_index.num_documents), [len(d) for d in docs_with_eos]))
    assert np.array_equal(g_pos[order], np.concatenate([np.arange(len(d)) for d in docs_with_eos]))
    assert np.array_equal(out["input_ids"][valid][order], np.concatenate(docs_with_eos))
    # padding and labels: next token within the piece, -100 at a piece's end and on padding
    assert np.all(out["input_ids"][~valid] == small_index.pad_id) and np.all(out["labels"][~valid] == -100)
    same_piece = valid[:, 1:] & (out["position_ids"][:, 1:] == out["position_ids"][:, :-1] + 1)
    assert np.array_equal(out["labels"][:, :-1][same_piece], out["input_ids"][:, 1:][same_piece])
    assert np.all(out["labels"][:, :-1][~same_piece] == -100) and np.all(out["labels"][:, -1] == -100)
    # position ids restart at each piece: 0 at the first position of each span
    first = np.zeros_like(valid)
    first[:, 0] = True
    first[:, 1:] = out["document_ids"][:, 1:] != out["document_ids"][:, :-1]
    assert np.all(out["position_ids"][first & valid] == 0)


def _reference_sample(index: TokenIndex, layout, sample_id: int) -> dict[str, list[int]]:
    """A per-sample, per-token reference reading of one sample, straight from the layout's spans."""
    L, concat = layout.config.seq_len, layout.config.kind == "concat"
    toks, docs, pos = [], [], []
    for doc, start, stop in layout.locate(np.array([sample_id])).sample(0):
        full = list(index.document_tokens(doc)) + [index.eos_id]
        toks += full[start:stop]
        docs += [doc] * (stop - start)
        pos += list(range(stop - start))
    if concat:
        return {"input_ids": toks[:L], "labels": toks[1 : L + 1], "document_ids": docs[:L]}
    labels = []
    for i in range(len(toks)):
        nxt = i + 1 < len(toks) and docs[i + 1] == docs[i] and pos[i + 1] == pos[i] + 1
        labels.append(toks[i + 1] if nxt else -100)
    pad = L - len(toks)
    return {
        "input_ids": toks + [index.pad_id] * pad,
        "labels": labels + [-100] * pad,
        "document_ids": docs + [-1] * pad,
        "position_ids": pos + [0] * pad,
    }


@given(
    kind=st.sampled_from(["concat", "document", "bestfit"]),
    seq_len=st.integers(2, 300),  # 1 is refused for document/bestfit (no label)
    seed=st.integers(0, 2**32),
    picks=st.lists(st.floats(0, 1, exclude_max=True), min_size=1, max_size=6),
)
def test_batched_read_equals_per_sample_reference(small_index, kind, seq_len, seed, picks):
    layout = small_index.layout(LayoutConfig(kind=kind, seq_len=seq_len, seed=seed, window_docs=4))
    ds = PackedDataset(small_index, layout)
    ids = [int(p * len(ds)) for p in picks]
    batch = ds.get_batch(ids)
    for row, sid in enumerate(ids):
        ref = _reference_sample(small_index, layout, sid)
        for key, value in ref.items():
            assert batch[key][row].tolist() == value, (key, sid)
        single = ds[sid]
        assert all(torch.equal(single[k], batch[k][row]) for k in batch)


@pytest.fixture(scope="module")
def lean_index(tmp_path_factory, small_corpus, small_tokenizer):
    return build_index(
        small_corpus, small_tokenizer, cache_dir=tmp_path_factory.mktemp("lean"), store_tokens=False, progress=False
    )


@pytest.mark.parametrize("kind", ["concat", "document", "bestfit"])
def test_on_the_fly_equals_stored(small_index, lean_index, small_corpus, small_tokenizer, kind):
    config = LayoutConfig(kind=kind, seq_len=64, seed=2, window_docs=5)
    stored = PackedDataset(small_index, small_index.layout(config))
    fly = PackedDataset(lean_index, lean_index.layout(config), dataset=small_corpus, tokenizer=small_tokenizer)
    ids = np.random.default_rng(0).integers(0, len(stored), 200)
    a, b = stored.get_batch(ids), fly.get_batch(ids)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_on_the_fly_needs_text_and_checks_lengths(tmp_path, small_tokenizer):
    texts = ["alpha = 1\n", "def beta():\n    pass\n", "gamma = [1, 2, 3]\n"]
    ds = datasets.Dataset(datasets.table.InMemoryTable.from_pydict({"text": texts}), fingerprint="fixed-fingerprint")
    index = build_index(ds, small_tokenizer, cache_dir=tmp_path, store_tokens=False, progress=False)
    layout = index.layout(LayoutConfig(kind="document", seq_len=8))
    with pytest.raises(ValueError, match="stores no tokens"):
        PackedDataset(index, layout)
    # the same fingerprint over other text (a dataset whose fingerprint did not follow an edit): caught, never misread
    edited = datasets.Dataset(
        datasets.table.InMemoryTable.from_pydict({"text": [texts[0], texts[1] + "# more\n", texts[2]]}),
        fingerprint="fixed-fingerprint",
    )
    ds_edit = PackedDataset(index, layout, dataset=edited, tokenizer=small_tokenizer)
    doc1 = [i for i in range(len(ds_edit)) if 1 in layout.locate(np.array([i])).doc_ids]
    with pytest.raises(TokenIndexError, match="document 1 tokenizes to .* tokens on the fly but the index"):
        ds_edit.get_batch(doc1)
    with pytest.raises(ValueError, match="other document lengths"):
        PackedDataset(index, make_layout(layout.config, np.array([1, 2])))


def test_pickled_dataset_reads_the_same(small_index):
    for kind in ("concat", "bestfit"):
        ds = PackedDataset(small_index, small_index.layout(LayoutConfig(kind=kind, seq_len=50, window_docs=3)))
        clone = pickle.loads(pickle.dumps(ds))
        a, b = ds.get_batch([0, 7, 3]), clone.get_batch([0, 7, 3])
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_batch_block_is_reused_only_once_nothing_holds_it(small_index):
    """The main process reuses a batch's memory (no page faults on a fresh block per batch) only once every tensor,
    view, detached tensor and numpy array of it is gone: a batch held in any of those forms never changes."""
    ds = PackedDataset(small_index, small_index.layout(LayoutConfig(kind="concat", seq_len=50)))
    holds = {
        "the batch": lambda b: b,
        "a field": lambda b: {"labels": b["labels"]},
        "a view": lambda b: {"view": b["input_ids"][1:, 5:]},
        "a detached field": lambda b: {"detached": b["position_ids"].detach()},
        "a numpy array": lambda b: {
            "numpy": torch.from_numpy(b["document_ids"].numpy().copy()),
            "array": b["document_ids"].numpy(),
        },
    }
    for what, hold in holds.items():
        held = hold(ds.get_batch([0, 7, 3]))
        want = {k: torch.as_tensor(v).clone() for k, v in held.items()}
        others = [ds.get_batch([5, 1, 2]) for _ in range(6)]  # more batches than the pool keeps blocks
        assert all(torch.equal(torch.as_tensor(held[k]), want[k]) for k in held), what
        del held, others
    first = ds.get_batch([0, 7, 3])["labels"].data_ptr()  # dropped at once: its block is free for the next batch
    assert ds.get_batch([0, 7, 3])["labels"].data_ptr() == first


def _loader_steps(ds, plan, rank, start_step, stop_step, num_workers, collate=None):
    sampler = DeterministicBatchSampler(plan, rank, start_step=start_step, stop_step=stop_step)
    kwargs = {"collate_fn": collate} if collate else {}
    loader = DataLoader(ds, batch_sampler=sampler, num_workers=num_workers, **kwargs)
    return [(step, mbs) for step, mbs in sampler.steps(loader)]


def test_resumed_multiworker_loader_equals_uninterrupted(small_index, lean_index, small_corpus, small_tokenizer):
    config = LayoutConfig(kind="bestfit", seq_len=64, seed=4, window_docs=6)
    layout = small_index.layout(config)
    ds = PackedDataset(small_index, layout)
    plan = Plan(layout.num_samples, seed=9, global_batch_size=8, micro_batch_size=2, world_size=2)
    full = _loader_steps(ds, plan, rank=1, start_step=0, stop_step=6, num_workers=2)
    resumed = _loader_steps(ds, plan, rank=1, start_step=3, stop_step=6, num_workers=2, collate=collate_micro_batch)
    assert [s for s, _ in full] == list(range(6)) and [s for s, _ in resumed] == [3, 4, 5]
    for (s_full, mb_full), (s_res, mb_res) in zip(full[3:], resumed):
        assert s_full == s_res and len(mb_full) == len(mb_res) == 2
        for a, b in zip(mb_full, mb_res):
            assert set(a) == {"input_ids", "labels", "position_ids", "document_ids"}
            assert a["input_ids"].shape == (2, 64) and a["input_ids"].dtype == torch.int64
            assert all(torch.equal(a[k], b[k]) for k in a)
    # tokenized on the fly inside two workers: the same tensors
    fly = PackedDataset(lean_index, lean_index.layout(config), dataset=small_corpus, tokenizer=small_tokenizer)
    resumed_fly = _loader_steps(fly, plan, rank=1, start_step=3, stop_step=6, num_workers=2)
    for (_, mb_full), (_, mb_fly) in zip(full[3:], resumed_fly):
        assert all(torch.equal(a[k], b[k]) for a, b in zip(mb_full, mb_fly) for k in a)
    # and each micro batch is exactly the plan's samples
    step, mbs = full[4]
    want = ds.get_batch(plan.micro_batch(4, 1, 1))
    assert all(torch.equal(mbs[1][k], want[k]) for k in want)


def test_nothing_per_document_lives_in_python_containers(small_index):
    """Workers must not grow by copy-on-read: the dataset, its layout and index hold arrays (memory
    maps), no big lists."""
    for kind in ("concat", "document", "bestfit"):
        ds = PackedDataset(small_index, small_index.layout(LayoutConfig(kind=kind, seq_len=32, window_docs=4)))
        ds.get_batch(np.arange(min(len(ds), 64)))
        for obj in (ds, ds.layout, ds.index):
            for name, value in vars(obj).items():
                if isinstance(value, (list, tuple, dict, set)) and name != "meta":
                    assert len(value) < 16, (kind, type(obj).__name__, name, len(value))
        assert ds.index.tokens.memory_mapped and ds.index.lengths.memory_mapped


def test_core_modules_do_not_import_torch():
    import subprocess
    import sys

    code = (
        "import sys, detsampler, detsampler.index, detsampler.text.corpus, detsampler.cli, detsampler.index.prepare,"
        " detsampler.gather; assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    import detsampler

    assert detsampler.PackedDataset is PackedDataset
