"""Chat and instruction data in the index: rendering under each loss-mask policy, the stored mask, and the packed
dataset's ``loss_mask`` and labels, each equal to rendering every example by hand with the tokenizer."""

from __future__ import annotations

import numpy as np
import pytest

from detsampler.index import build_index
from detsampler.index.format import CHAT_FORMAT_VERSION, TokenIndexError
from detsampler.index.reader import TokenIndex
from detsampler.layout import LAYOUT_KINDS, LayoutConfig
from detsampler.loader.dataset import PackedDataset
from detsampler.text.chat import ChatConfig
from tests.chat_data import (
    PLAIN_TEMPLATE,
    chat_dataset,
    crossing_labels,
    expected_sample,
    hand_rendered,
    make_chat_tokenizer,
    prompt_dataset,
    with_empty_prompts,
)

POLICIES = [
    ChatConfig(policy="assistant"),
    ChatConfig(policy="last_turn"),
    ChatConfig(policy="all"),
    ChatConfig(column="prompt", completion_column="completion", policy="completion"),
]


@pytest.fixture(scope="module")
def chat_tok(tmp_path_factory):
    return make_chat_tokenizer(tmp_path_factory.mktemp("chat-tok"))


@pytest.fixture(scope="module")
def chat_rows():
    return chat_dataset(48, seed=1)


@pytest.fixture(scope="module")
def prompt_rows():
    return prompt_dataset(48, seed=2)


def _data(config, chat_rows, prompt_rows):
    return prompt_rows if config.is_prompt_completion else chat_rows


@pytest.mark.parametrize("config", POLICIES, ids=lambda c: c.policy)
def test_stored_tokens_and_mask_equal_each_example_rendered_by_hand(config, chat_tok, chat_rows, prompt_rows, tmp_path):
    data = _data(config, chat_rows, prompt_rows)
    index = build_index(data, chat_tok, cache_dir=tmp_path, progress=False, chat=config)
    assert index.meta["format_version"] == CHAT_FORMAT_VERSION
    assert index.chat == ChatConfig(**{**config.__dict__, "chat_template": index.chat.chat_template})
    rendered = hand_rendered(chat_tok, data, config)
    for d, (ids, mask) in enumerate(rendered):
        start, stop = int(index.offsets[d]), int(index.offsets[d + 1])
        assert np.array_equal(index.tokens[start:stop], ids[:-1])
        assert np.array_equal(np.asarray(index.loss_mask[start:stop]).astype(bool), mask[:-1])
    trained = sum(int(m[:-1].sum()) for _, m in rendered)
    assert index.meta["chat"]["num_trained_tokens"] == trained
    assert 0 < trained <= index.num_tokens
    if config.policy != "all":
        assert trained < index.num_tokens


@pytest.mark.parametrize("kind", LAYOUT_KINDS)
@pytest.mark.parametrize("config", POLICIES, ids=lambda c: c.policy)
@pytest.mark.parametrize("store_tokens", [True, False], ids=["stored", "on-the-fly"])
def test_loss_mask_and_labels_equal_hand_rendering(
    kind, config, store_tokens, chat_tok, chat_rows, prompt_rows, tmp_path
):
    data = _data(config, chat_rows, prompt_rows)
    index = build_index(data, chat_tok, cache_dir=tmp_path, progress=False, chat=config, store_tokens=store_tokens)
    layout = index.layout(LayoutConfig(kind=kind, seq_len=48, seed=3))
    extra = {} if store_tokens else {"dataset": data, "tokenizer": chat_tok}
    ds = PackedDataset(index, layout, **extra)
    ids = np.arange(len(ds))
    batch = ds.get_batch(ids)
    rendered = hand_rendered(chat_tok, data, config)
    spans = layout.locate(ids)
    concat = kind == "concat"
    for i in ids:
        want = expected_sample(rendered, spans, int(i), 48, concat, index.pad_id)
        for name, value in want.items():
            assert np.array_equal(batch[name][i].numpy(), value), (name, i)
    assert batch["loss_mask"].dtype == __import__("torch").bool
    assert bool((batch["loss_mask"] == (batch["labels"] != -100)).all())
    if concat:
        tokens = PackedDataset(index, layout, output="tokens", **extra).get_batch(ids)
        assert np.array_equal(tokens["loss_mask"].numpy(), batch["loss_mask"].numpy())
        assert np.array_equal(tokens["tokens"][:, :-1].numpy(), batch["input_ids"].numpy())


EXAMPLE_LAYOUTS = [("concat", False), ("concat", True), ("document", False), ("document", True), ("bestfit", False)]


@pytest.mark.parametrize(
    ("kind", "epoch_order"), EXAMPLE_LAYOUTS, ids=lambda v: {True: "epoch_order", False: ""}.get(v, v)
)
@pytest.mark.parametrize("config", POLICIES, ids=lambda c: c.policy)
def test_no_trained_label_crosses_from_one_example_into_the_next(
    kind, epoch_order, config, chat_tok, chat_rows, prompt_rows, tmp_path
):
    """Issue 31 item 6: under ``concat`` the label at each conversation's EOS was the next conversation's first token,
    trained under policy ``all`` (and ``completion`` after an empty prompt). Now, in every layout and both outputs,
    every trained label's position and target are of one span (one example, or a piece of one): the label at each
    example's EOS is -100, as TRL's padding-free collator makes it."""
    data = with_empty_prompts(prompt_rows) if config.is_prompt_completion else chat_rows
    index = build_index(data, chat_tok, cache_dir=tmp_path, progress=False, chat=config)
    layout = index.layout(LayoutConfig(kind=kind, seq_len=48, seed=3, epoch_order=epoch_order))
    ids = np.arange(layout.num_samples) + (layout.num_samples if epoch_order else 0)  # epoch 1: its own order
    spans = layout.locate(ids)
    for output in ("fields", "tokens") if kind == "concat" else ("fields",):
        batch = PackedDataset(index, layout, output=output).get_batch(ids)
        mask = batch["loss_mask"].numpy()
        assert crossing_labels(spans, layout.sample_len, mask) == 0, output
        assert mask.any()


def test_plain_index_has_no_loss_mask(small_index):
    ds = PackedDataset(small_index, small_index.layout(LayoutConfig(kind="bestfit", seq_len=64)))
    assert "loss_mask" not in ds.get_batch([0, 1])
    assert small_index.loss_mask is None and small_index.chat is None


def test_template_and_policy_are_the_index_identity_and_resume_refuses_a_change(chat_tok, chat_rows, tmp_path):
    from detsampler import DataFingerprint, Plan, check_resume

    plain = build_index(chat_rows, chat_tok, cache_dir=tmp_path, progress=False, chat=ChatConfig(policy="all"))
    other_template = ChatConfig(policy="all", chat_template=PLAIN_TEMPLATE)
    variants = [
        build_index(chat_rows, chat_tok, cache_dir=tmp_path, progress=False, chat=c)
        for c in (ChatConfig(policy="assistant"), ChatConfig(policy="last_turn"), other_template)
    ]
    keys = {plain.fingerprint} | {v.fingerprint for v in variants}
    assert len(keys) == 4
    assert variants[2].meta["chat"]["template"] == PLAIN_TEMPLATE
    # the same tokens under "assistant" and "last_turn": the mask differs, so must the data fingerprint
    config = LayoutConfig(kind="bestfit", seq_len=64)
    prints = []
    for index in (variants[0], variants[1]):
        layout = index.layout(config)
        prints.append(
            DataFingerprint.of(index, layout, Plan(layout.num_samples, seed=0, global_batch_size=2, micro_batch_size=1))
        )
    check_resume(prints[0], prints[0], 3)
    with pytest.raises(ValueError, match="index"):
        check_resume(prints[0], prints[1], 3)
    # reopening by path keeps the configuration, template text included
    again = TokenIndex.open(variants[2].path)
    assert again.chat == other_template


def test_plain_indexes_keep_their_format_and_cache_key(small_corpus, small_tokenizer, small_index):
    from detsampler.index.format import INDEX_FORMAT_VERSION, index_cache_key

    assert small_index.meta["format_version"] == INDEX_FORMAT_VERSION
    assert "chat" not in small_index.meta
    assert small_index.fingerprint == index_cache_key(small_corpus, small_tokenizer, chat=None)


def test_a_damaged_loss_mask_is_refused(chat_tok, chat_rows, tmp_path):
    import shutil

    from detsampler.index.checksums import ChecksumError

    built = build_index(chat_rows, chat_tok, cache_dir=tmp_path / "a", progress=False, chat=ChatConfig())
    copy = tmp_path / "copy"
    shutil.copytree(built.path, copy)
    mask_file = copy / "loss_mask.npy"
    data = bytearray(mask_file.read_bytes())
    data[-1] ^= 1  # same size: found by the chunk checksum when read
    mask_file.write_bytes(bytes(data))
    index = TokenIndex.open(copy)
    ds = PackedDataset(index, index.layout(LayoutConfig(kind="document", seq_len=512)))
    with pytest.raises(ChecksumError, match="loss_mask"):
        ds.get_batch(np.arange(len(ds)))
    with pytest.raises(ChecksumError, match="loss_mask"):  # the full check (verify --tokens) reads it too
        TokenIndex.open(copy, verify_tokens=True)
    mask_file.write_bytes(bytes(data[:-1]))  # truncated: refused at open
    with pytest.raises(TokenIndexError, match="loss_mask.npy"):
        TokenIndex.open(copy)


def test_bad_chat_input_is_refused(chat_tok, chat_rows, prompt_rows, small_tokenizer, tmp_path):
    import datasets

    with pytest.raises(ValueError, match="allowed policies for a messages column are assistant, last_turn, all"):
        ChatConfig(policy="completion")
    with pytest.raises(ValueError, match="allowed policies for prompt/completion columns are completion, all"):
        ChatConfig(column="prompt", completion_column="completion", policy="assistant")
    with pytest.raises(ValueError, match="generation"):
        build_index(chat_rows, chat_tok, cache_dir=tmp_path, chat=ChatConfig(chat_template=PLAIN_TEMPLATE))
    with pytest.raises(ValueError, match="transformers tokenizer directory"):
        build_index(chat_rows, small_tokenizer, cache_dir=tmp_path, chat=ChatConfig())
    with pytest.raises(ValueError, match="is not a column"):
        build_index(prompt_rows, chat_tok, cache_dir=tmp_path, chat=ChatConfig())
    bad = datasets.Dataset.from_dict({"messages": [[{"role": "user", "content": "hi"}], []]})
    with pytest.raises(ValueError, match="document 1: column 'messages' holds list"):
        build_index(bad, chat_tok, cache_dir=tmp_path, progress=False, chat=ChatConfig(policy="all"))
    missing = datasets.Dataset.from_dict({"prompt": ["a", None], "completion": ["b", "c"]})
    config = ChatConfig(column="prompt", completion_column="completion", policy="completion")
    with pytest.raises(ValueError, match="document 1: column 'prompt' holds None"):
        build_index(missing, chat_tok, cache_dir=tmp_path, progress=False, chat=config)
    assert not list(tmp_path.glob("index-*"))  # a refused build leaves nothing that opens


def test_parallel_build_equals_one_process(chat_tok, chat_rows, tmp_path):
    one = build_index(chat_rows, chat_tok, cache_dir=tmp_path / "1", progress=False, chat=ChatConfig())
    two = build_index(chat_rows, chat_tok, cache_dir=tmp_path / "2", progress=False, chat=ChatConfig(), num_proc=2)
    assert one.fingerprint == two.fingerprint
    for name in ("tokens.npy", "loss_mask.npy", "lengths.npy"):
        assert (one.path / name).read_bytes() == (two.path / name).read_bytes()


def test_the_benchmark_s_unmasked_reader_reads_the_same_samples(chat_tok, chat_rows, tmp_path):
    """Benchmark 14 compares the loader with and without the mask over one index: the samples are the same, the labels
    differ exactly where the mask takes them out."""
    from tests.benchmarks.bench_sft_mask import _without_mask

    index = build_index(chat_rows, chat_tok, cache_dir=tmp_path, progress=False, chat=ChatConfig())
    for kind in LAYOUT_KINDS:
        layout = index.layout(LayoutConfig(kind=kind, seq_len=64))
        ids = np.arange(layout.num_samples)
        masked, plain = (PackedDataset(i, layout).get_batch(ids) for i in (index, _without_mask(index)))
        assert "loss_mask" not in plain
        for name in ("input_ids", "position_ids", "document_ids"):
            assert np.array_equal(masked[name].numpy(), plain[name].numpy())
        keep = masked["loss_mask"].numpy()
        assert np.array_equal(masked["labels"].numpy()[keep], plain["labels"].numpy()[keep])
        assert (plain["labels"].numpy()[~keep] != -100).any()


def test_the_hf_collator_keeps_the_mask_of_token_samples(chat_tok, chat_rows, tmp_path):
    """``output="tokens"`` carries the mask beside the ids: the HF collator's labels from it equal those from the
    fields (labels already -100 there), so masked tokens are not trained through either."""
    import torch

    from detsampler.integrations.hf import CausalLMCollator

    index = build_index(chat_rows, chat_tok, cache_dir=tmp_path, progress=False, chat=ChatConfig())
    layout = index.layout(LayoutConfig(kind="concat", seq_len=64))
    ids = np.arange(layout.num_samples)
    collate = CausalLMCollator()
    from_fields = collate(PackedDataset(index, layout).__getitems__(ids))
    from_tokens = collate(PackedDataset(index, layout, output="tokens").__getitems__(ids))
    for name in ("input_ids", "labels", "shift_labels"):
        assert torch.equal(from_fields[name], from_tokens[name]), name
    assert (from_tokens["shift_labels"] == -100).any()


def test_a_mixture_of_chat_and_plain_text_has_a_loss_mask_for_every_row(chat_tok, chat_rows, tmp_path):
    import datasets

    from detsampler.loader.mixture_dataset import MixtureDataset
    from detsampler.mixture import Mixture

    plain_rows = datasets.Dataset.from_dict({"text": [m[-1]["content"] * 3 for m in chat_rows["messages"]]})
    chat = build_index(chat_rows, chat_tok, cache_dir=tmp_path, progress=False, chat=ChatConfig())
    plain = build_index(plain_rows, chat_tok, cache_dir=tmp_path, progress=False)
    config = LayoutConfig(kind="bestfit", seq_len=64)
    layouts = [chat.layout(config), plain.layout(config)]
    mixture = Mixture(layouts, [(0, [1, 1])], 0)
    packed = [PackedDataset(chat, layouts[0]), PackedDataset(plain, layouts[1])]
    ids = [0, mixture.offsets[1], 1, mixture.offsets[1] + 1]  # chat, plain, chat, plain
    for order in (ids, ids[::-1]):  # whichever source comes first in the batch
        batch = MixtureDataset(packed, mixture).__getitems__(order).batch
        assert batch["loss_mask"].shape == batch["labels"].shape
        assert bool((batch["loss_mask"] == (batch["labels"] != -100)).all())
    one = {k: v[0] for k, v in packed[0].get_batch([0]).items()}
    assert np.array_equal(batch["loss_mask"][3].numpy(), one["loss_mask"].numpy())  # ids[::-1][3] is chat sample 0
