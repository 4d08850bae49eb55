"""An erased document never steers the instance filter (issue 32's leftover): ``erase_documents`` writes the pad id over
an erased document's tokens, and a run of 32 or more pad ids is a repetition to OLMo-core's filter, so before this
fix every sample holding an erased document of >= 32 tokens was flagged and the other documents packed beside it
(``concat``, ``bestfit``) stopped training: the erasure changed what other documents train on. Now the erased
positions equal nothing to the filter, as padding does: the verdict of every sample after the erasure is the filter of
its tokens before it with the erased positions left out, so it never depends on them and still sees the rest; through
``PackedDataset`` (fields and ``output="tokens"``), a mixture, ``stats``' counts and an index erased in moto's S3."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from detsampler import LayoutConfig, PackedDataset, Plan
from detsampler.filter import RepetitionFilter
from detsampler.index import TokenIndex, build_index
from detsampler.index.erase import erase_documents
from detsampler.loader.dataset import instance_filter_counts

FILTER = RepetitionFilter()  # OLMo-core's defaults: periods 1 .. 13, 32 repetitions
NUM_DOCS = 24
ERASED = list(range(2, NUM_DOCS, 3))  # plain code, 38 to 104 tokens each: >= 32 pad ids once erased
REPEATING = list(range(1, NUM_DOCS, 3))  # code with a 40-token line of '=': flagged by themselves
KINDS = ["concat", "bestfit"]


def _texts(source: str) -> list[str]:
    """Documents shorter than a 128-token sample (so ``bestfit`` packs two or three to a row): every third holds a
    ``# ====...`` line of 40 '=' (a period-1 run of 40 tokens), the others are plain code."""
    texts = []
    for i in range(NUM_DOCS):
        a = 1000 + 997 * i
        if i in REPEATING:
            texts.append(source[a : a + 30] + "\n#" + "=" * 40 + "\n" + source[a + 30 : a + 40])
        else:
            texts.append(source[a : a + 90 + 23 * (i % 7)])
    return texts


@pytest.fixture
def crafted(small_corpus, small_tokenizer, tmp_path):
    import datasets

    rows = datasets.Dataset.from_dict({"text": _texts(small_corpus[12]["text"])})
    return build_index(rows, small_tokenizer, cache_dir=tmp_path / "crafted", progress=False)


def _unerased_verdict(index: TokenIndex, layout, ids: np.ndarray) -> tuple[np.ndarray, dict]:
    """The filter's flags of ``ids`` read before the erasure with the erased documents' positions (and padding) left
    out: what the verdict must be after it. And the unerased, unfiltered batch."""
    batch = PackedDataset(index, layout).get_batch(ids)
    docs = batch["document_ids"].numpy()
    return FILTER.flags(batch["input_ids"].numpy(), (docs >= 0) & ~np.isin(docs, ERASED)), batch


def _check_verdict(index: TokenIndex, kind: str, want: np.ndarray, ids: np.ndarray) -> None:
    """The filtered read of the erased ``index`` flags exactly ``want``; its samples are the unfiltered read's, with
    the flagged rows' labels -100; and the samples that show the fault are there: a sample holding >= 32 pad ids of
    an erased document beside another document's trained labels, not flagged (the pad ids alone would flag it), and
    one holding an erased document flagged by a repetition elsewhere."""
    layout = index.layout(LayoutConfig(kind=kind, seq_len=128))
    plain = PackedDataset(index, layout).get_batch(ids)
    got = PackedDataset(index, layout, instance_filter=FILTER, instance_mask=True).get_batch(ids)
    assert got["instance_mask"].tolist() == (~want).tolist(), kind
    for key in ("input_ids", "position_ids", "document_ids"):
        assert torch.equal(got[key], plain[key]), (kind, key)
    assert torch.equal(got["labels"], plain["labels"].masked_fill(torch.from_numpy(want)[:, None], -100)), kind
    docs, inputs = plain["document_ids"].numpy(), plain["input_ids"].numpy()
    erased = np.isin(docs, ERASED)
    by_pad_ids = FILTER.flags(inputs, docs >= 0)  # the former verdict: the erased positions' pad ids compared
    pad_run = ((inputs == index.pad_id) & erased).sum(axis=1) >= 32
    others_train = ((plain["labels"].numpy() != -100) & ~erased & (docs >= 0)).any(axis=1)
    spared = pad_run & others_train & by_pad_ids & ~want
    assert spared.any(), kind  # the fault: before the fix these samples were flagged, their other documents untrained
    assert (got["labels"].numpy()[spared] != -100).any(axis=1).all()
    assert (erased.any(axis=1) & want).any(), kind  # flagged by what they hold besides the erased document


@pytest.mark.parametrize("kind", KINDS)
def test_an_erased_document_never_steers_the_instance_filter(crafted, kind):
    layout = crafted.layout(LayoutConfig(kind=kind, seq_len=128))
    ids = np.arange(layout.num_samples)
    want, _ = _unerased_verdict(crafted, layout, ids)
    unerased = PackedDataset(crafted, layout, instance_filter=FILTER, instance_mask=True).get_batch(ids)
    assert unerased["instance_mask"].tolist() == (~want).tolist()  # nothing erased: the erased docs repeat nothing
    erase_documents(crafted.path, ERASED)
    index = TokenIndex.open(crafted.path)
    assert index.erased_documents.tolist() == ERASED
    _check_verdict(index, kind, want, ids)
    if kind == "concat":  # the token ids output carries the same mask, and its loss mask the fields' erased labels
        layout = index.layout(LayoutConfig(kind=kind, seq_len=128))
        tokens = PackedDataset(index, layout, output="tokens", instance_filter=FILTER).get_batch(ids)
        fields = PackedDataset(index, layout).get_batch(ids)
        assert tokens["instance_mask"].tolist() == (~want).tolist()
        assert torch.equal(tokens["tokens"][:, :-1].long(), fields["input_ids"])
        assert torch.equal(tokens["loss_mask"], fields["labels"] != -100) and not tokens["loss_mask"].all()
    # stats' count of what the filter masks reads the same verdict
    layout = index.layout(LayoutConfig(kind=kind, seq_len=128))
    plan = Plan(layout.num_samples, seed=0, global_batch_size=2, micro_batch_size=2)
    counts = instance_filter_counts(index, layout, plan, range(layout.num_samples // 2), FILTER)
    read = np.concatenate([plan.global_batch(step) for step in range(layout.num_samples // 2)])
    assert counts["flagged_samples"] == int(want[read].sum()) and counts["samples"] == len(read)


def test_a_mixture_reads_the_same_verdict_per_source(crafted):
    from detsampler.loader.mixture_dataset import MixtureDataset
    from detsampler.mixture import Mixture

    configs = [LayoutConfig(kind=kind, seq_len=128) for kind in KINDS]
    wants = []
    for config in configs:
        layout = crafted.layout(config)
        wants.append(_unerased_verdict(crafted, layout, np.arange(layout.num_samples))[0])
    erase_documents(crafted.path, ERASED)
    index = TokenIndex.open(crafted.path)
    layouts = [index.layout(config) for config in configs]
    mixture = Mixture(layouts, [(0, [1, 1])], 0)
    packed = [PackedDataset(index, layout, instance_filter=FILTER, instance_mask=True) for layout in layouts]
    ids = np.arange(mixture.num_samples)
    got = MixtureDataset(packed, mixture).__getitems__(ids.tolist()).batch
    source, local = mixture.split_ids(ids)
    want = np.array([wants[k][i] for k, i in zip(source.tolist(), local.tolist())])
    assert got["instance_mask"].tolist() == (~want).tolist() and want.any() and not want.all()


def test_an_index_erased_in_a_bucket_reads_the_same_verdict(crafted, s3_bucket, tmp_path):
    from detsampler.index.push import push_index

    wants = {}
    for kind in KINDS:
        layout = crafted.layout(LayoutConfig(kind=kind, seq_len=128))
        wants[kind] = _unerased_verdict(crafted, layout, np.arange(layout.num_samples))[0]
    url = f"{s3_bucket}/erase-filter-{tmp_path.name}/{crafted.path.name}"
    push_index(crafted.path, url)
    erase_documents(url, ERASED)
    remote = TokenIndex.open(url, verify_tokens=True)
    assert remote.erased_documents.tolist() == ERASED
    for kind in KINDS:
        _check_verdict(remote, kind, wants[kind], np.arange(len(wants[kind])))


@pytest.mark.parametrize("kind", ["concat", "bestfit", "document"])
def test_the_erased_positions_are_the_erased_documents_positions(crafted, kind):
    """``erased_positions`` (from the spans alone) marks exactly the positions whose ``document_ids`` are erased, in
    each layout (padding at a row's tail included), and None for a batch holding no erased document."""
    from detsampler.loader.erased import erased_positions

    layout = crafted.layout(LayoutConfig(kind=kind, seq_len=128))
    ids = np.arange(layout.num_samples)
    spans = layout.locate(ids)
    docs = PackedDataset(crafted, layout).get_batch(ids)["document_ids"].numpy()
    got = erased_positions(spans, np.asarray(ERASED), 128)
    assert got is not None and np.array_equal(got, np.isin(docs, ERASED))
    assert erased_positions(spans, np.zeros(0, dtype=np.int64), 128) is None
    alone = ids[~np.isin(docs, ERASED).any(axis=1)]
    assert len(alone) and erased_positions(layout.locate(alone), np.asarray(ERASED), 128) is None
