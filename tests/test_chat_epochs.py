"""Every chat example exactly once per epoch, with its tokens and loss mask, across ranks, DataLoader workers, a resume
and a change of world size: the pretraining property harness (plans, the deterministic batch sampler, a DataLoader)
over a best-fit chat index whose examples are each packed whole."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from detsampler.index import build_index
from detsampler.layout import LayoutConfig
from detsampler.loader.dataset import PackedDataset, collate_micro_batch
from detsampler.loader.sampler import DeterministicBatchSampler
from detsampler.plan import Plan
from detsampler.text.chat import ChatConfig
from tests.chat_data import chat_dataset, hand_rendered, make_chat_tokenizer
from tests.strategies import seeds


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    tok = make_chat_tokenizer(tmp_path_factory.mktemp("tok"))
    rows = chat_dataset(40, seed=5)
    config = ChatConfig(policy="assistant")
    index = build_index(rows, tok, cache_dir=tmp_path_factory.mktemp("cache"), progress=False, chat=config)
    seq_len = int(np.max(np.asarray(index.lengths))) + 1  # every example (and its EOS) fits one sample whole
    layout = index.layout(LayoutConfig(kind="bestfit", seq_len=seq_len, seed=1, window_docs=16))
    return PackedDataset(index, layout), hand_rendered(tok, rows, config)


def _read(ds, plan: Plan, rank: int, start: int, stop: int, num_workers: int) -> list[dict]:
    sampler = DeterministicBatchSampler(plan, rank, start_step=start, stop_step=stop)
    loader = DataLoader(ds, batch_sampler=sampler, num_workers=num_workers, collate_fn=collate_micro_batch)
    return [{k: v.numpy() for k, v in batch.items()} for batch in loader]


def _examples(batch: dict) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """(document, input ids, loss mask) of each example in ``batch``'s rows, cut at document boundaries."""
    out = []
    for row in range(batch["input_ids"].shape[0]):
        docs = batch["document_ids"][row]
        for d in np.unique(docs[docs >= 0]):
            at = docs == d
            out.append((int(d), batch["input_ids"][row][at], batch["loss_mask"][row][at]))
    return out


@settings(max_examples=12)
@given(
    world=st.sampled_from([(1, 1), (2, 1), (2, 2), (4, 1)]),
    accum=st.integers(1, 2),
    seed=seeds,
    resume_world=st.sampled_from([1, 2, 4]),
    resume_at=st.floats(0, 1),
    num_workers=st.sampled_from([0, 0, 2]),
)
@example(world=(2, 1), accum=1, seed=0, resume_world=1, resume_at=0.5, num_workers=2)
def test_every_example_once_per_epoch_with_its_mask(packed, world, accum, seed, resume_world, resume_at, num_workers):
    ds, rendered = packed
    world_size, micro = world
    gbs = world_size * micro * accum
    if gbs % resume_world:
        resume_world = world_size
    plan = Plan(len(ds), seed, gbs, micro, world_size)
    epochs = gbs // math.gcd(len(ds), gbs)  # this many epochs end exactly at a step boundary
    num_steps = len(ds) * epochs // gbs
    resume = int(resume_at * num_steps)
    other = plan.with_world(resume_world, 1)
    seen: Counter = Counter()
    for p, start, stop in ((plan, 0, resume), (other, resume, num_steps)):
        for rank in range(p.world_size):
            for batch in _read(ds, p, rank, start, stop, num_workers):
                for doc, ids, mask in _examples(batch):
                    want_ids, want_mask = rendered[doc]
                    assert np.array_equal(ids, want_ids)  # the example whole, its EOS included
                    assert np.array_equal(mask, np.append(want_mask[1:], False))  # label p is token p + 1
                    seen[doc] += 1
    assert seen == Counter({d: epochs for d in range(len(rendered))})  # best-fit packs each example whole, once
    # step by step, the examples read are those of the plan's global batch (the per-epoch order is the plan's)
    for step in range(num_steps):
        want = Counter(int(d) for d in ds.layout.locate(plan.global_batch(step)).doc_ids)
        got: Counter = Counter()
        p = plan if step < resume else other
        for rank in range(p.world_size):
            for batch in _read(ds, p, rank, step, step + 1, 0):
                got.update(doc for doc, _, _ in _examples(batch))
        assert got == want
