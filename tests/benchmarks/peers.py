"""The real peers, driven through their own public APIs, over the same corpus and tokens as detsampler.

Each helper builds what a peer's own documentation asks a user to build (Megatron's ``.bin``/``.idx`` written by its
``IndexedDatasetBuilder``, OLMo-core's raw token array, a torchtitan dataset entry and a Hugging Face tokenizer) and
returns the peer's own dataset or loader object. Inputs hold the same tokens as detsampler's index: each document's
tokens followed by the EOS id (detsampler's EOS is virtual, the peers store it). ``missing()`` names the peers that are
not installed, so a benchmark can say why a contender did not run instead of failing.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import warnings
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "PEER_MODULES",
    "SentencePieceForTitan",
    "hf_tokenizer_dir",
    "megatron_blended_dataset",
    "megatron_gpt_dataset",
    "missing",
    "olmo_fsl_dataset",
    "olmo_fsl_loader",
    "titan_loader",
    "write_megatron",
    "write_megatron_synthetic",
    "write_token_file",
]

PEER_MODULES = {
    "megatron-core": "megatron.core.datasets.gpt_dataset",
    "ai2-olmo-core": "olmo_core.data",
    "torchtitan": "torchtitan.hf_datasets.text_datasets",
    "grain": "grain",
    "torchdata": "torchdata.stateful_dataloader",
    "accelerate": "accelerate",
    "tokenizers": "tokenizers",
}


def _quiet() -> None:
    warnings.filterwarnings("ignore")
    for name in ("megatron", "olmo_core", "torchtitan", "absl", "datasets"):
        logging.getLogger(name).setLevel(logging.ERROR)


def missing() -> dict[str, str]:
    """Peer name -> why it cannot be imported here (an empty dict when every peer imports)."""
    _quiet()
    out = {}
    for name, module in PEER_MODULES.items():
        try:
            importlib.import_module(module)
        except Exception as exc:
            out[name] = f"{type(exc).__name__}: {exc}"
    return out


# -- Megatron-LM (megatron-core)


def _megatron_prefix_done(prefix: Path) -> bool:
    return prefix.with_suffix(".idx").is_file() and prefix.with_suffix(".bin").is_file()


def write_megatron(prefix: Path, documents: Iterable[np.ndarray], eos_id: int, dtype=np.uint16) -> Path:
    """``prefix.bin`` / ``prefix.idx`` through megatron's ``IndexedDatasetBuilder``: one item per document, its tokens
    then EOS (what ``tools/preprocess_data.py --append-eod`` writes). Written once; reused when present."""
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    if _megatron_prefix_done(prefix):
        return prefix
    prefix.parent.mkdir(parents=True, exist_ok=True)
    builder = IndexedDatasetBuilder(str(prefix.with_suffix(".bin")), dtype=dtype)
    for doc in documents:
        builder.add_item(torch.from_numpy(np.append(doc, eos_id).astype(np.int64)))
        builder.end_document()
    builder.finalize(str(prefix.with_suffix(".idx")))
    return prefix


def write_megatron_synthetic(
    prefix: Path, lengths: np.ndarray, source: np.ndarray, eos_id: int, chunk: int = 250_000
) -> Path:
    """A ``.bin``/``.idx`` of ``len(lengths)`` documents of the given lengths (EOS included), their tokens read in turn
    from ``source`` (a real token stream, repeated as often as needed), through ``IndexedDatasetBuilder.add_document`` a
    chunk of documents at a time (one sequence per document of the chunk)."""
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    if _megatron_prefix_done(prefix):
        return prefix
    prefix.parent.mkdir(parents=True, exist_ok=True)
    builder = IndexedDatasetBuilder(str(prefix.with_suffix(".bin")), dtype=np.uint16)
    at = 0
    for lo in range(0, len(lengths), chunk):
        part = lengths[lo : lo + chunk]
        n = int(part.sum())
        pieces, need = [], n
        while need:
            take = source[at : at + need]
            pieces.append(take)
            need -= take.size
            at = (at + take.size) % source.size
        tokens = np.concatenate(pieces).astype(np.uint16)
        tokens[np.cumsum(part) - 1] = eos_id
        builder.add_document(torch.from_numpy(tokens.astype(np.int32)), part.tolist())
    builder.finalize(str(prefix.with_suffix(".idx")))
    return prefix


class _TokenIds:
    """The token-id facts megatron's ``GPTDatasetConfig.tokenizer`` is read for (eod, pad, vocab size, cache key);
    the tokens themselves come from the ``.bin`` file."""

    def __init__(self, vocab_size: int, eod: int, pad: int) -> None:
        self.vocab_size, self.eod, self.pad = vocab_size, eod, pad

    @property
    def unique_identifiers(self) -> OrderedDict:
        return OrderedDict({"class": "detsampler-bench", "vocab_size": self.vocab_size, "eod": self.eod})


def megatron_gpt_dataset(
    prefix: Path, num_samples: int, seq_len: int, vocab_size: int, eos_id: int, cache: Path, seed: int = 0
):
    """The train split of megatron's ``GPTDataset`` over ``prefix`` (all documents), built as a user does through
    ``BlendedMegatronDatasetBuilder``; its document/sample/shuffle indices are cached under ``cache``."""
    return megatron_blended_dataset([prefix], None, num_samples, seq_len, vocab_size, eos_id, cache, seed)


def megatron_blended_dataset(
    prefixes: list[Path],
    weights: list[float] | None,
    num_samples: int,
    seq_len: int,
    vocab_size: int,
    eos_id: int,
    cache: Path,
    seed: int = 0,
):
    """Megatron's train split over ``prefixes`` blended by ``weights`` (a ``BlendedDataset`` when there are several, the
    ``GPTDataset`` itself for one), through ``BlendedMegatronDatasetBuilder``; indices cached under ``cache``."""
    _quiet()
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    config = GPTDatasetConfig(
        random_seed=seed,
        sequence_length=seq_len,
        blend_per_split=[([str(p) for p in prefixes], weights), None, None],
        path_to_cache=str(cache),
        tokenizer=_TokenIds(vocab_size, eos_id, -1),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=False,
        mmap_bin_files=True,
    )
    _single_process_group(cache)
    train, _, _ = BlendedMegatronDatasetBuilder(GPTDataset, [num_samples, None, None], lambda: True, config).build()
    return train


def _single_process_group(directory: Path) -> None:
    """A one-rank gloo process group (megatron's BlendedDataset asks for the rank when it writes its cache)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        directory.mkdir(parents=True, exist_ok=True)
        init = directory / f".pg-{os.getpid()}"
        init.unlink(missing_ok=True)
        dist.init_process_group("gloo", init_method=f"file://{init}", rank=0, world_size=1)


# -- OLMo-core


def write_token_file(path: Path, documents: Iterable[np.ndarray], eos_id: int, dtype=np.uint16) -> Path:
    """A raw token array (what OLMo-core's numpy datasets memory-map): each document's tokens then EOS."""
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        for doc in documents:
            f.write(np.append(doc, eos_id).astype(dtype).tobytes())
    os.replace(tmp, path)
    return path


def olmo_fsl_dataset(paths: list[Path], seq_len: int, vocab_size: int, eos_id: int, pad_id: int, work_dir: Path):
    """OLMo-core's ``NumpyFSLDataset`` over raw token files, prepared (its offsets computed) in ``work_dir``."""
    _quiet()
    from olmo_core.data import NumpyFSLDataset

    ds = NumpyFSLDataset(
        *[str(p) for p in paths],
        sequence_length=seq_len,
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        vocab_size=vocab_size,
        dtype=np.uint16,
    )
    ds.work_dir = work_dir
    ds.prepare()
    return ds


def olmo_fsl_loader(dataset, global_batch_tokens: int, work_dir: Path, num_workers: int = 0, seed: int = 0):
    """OLMo-core's ``NumpyFSLDataLoader`` (shuffled; one rank) over ``dataset``, its global indices built in
    ``work_dir``."""
    from olmo_core.data import NumpyFSLDataLoader

    work_dir.mkdir(parents=True, exist_ok=True)
    return NumpyFSLDataLoader(
        dataset,
        global_batch_size=global_batch_tokens,
        collator=_olmo_collator(dataset),
        work_dir=str(work_dir),
        seed=seed,
        shuffle=True,
        num_workers=num_workers,
        dp_world_size=1,
        dp_rank=0,
        fs_local_rank=0,
    )


def _olmo_collator(dataset):
    from olmo_core.data import DataCollator

    return DataCollator(pad_token_id=dataset.pad_token_id)


# -- torchtitan and a Hugging Face tokenizer


def hf_tokenizer_dir(directory: Path, texts: Iterable[str], vocab_size: int) -> Path:
    """A byte-level BPE ``tokenizer.json`` (Hugging Face ``tokenizers``) trained on ``texts``, with an ``<|eos|>`` token
    declared in ``tokenizer_config.json``: what torchtitan's ``HuggingFaceTokenizer`` loads from a directory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if (directory / "tokenizer.json").is_file():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|bos|>", "<|eos|>"], show_progress=False)
    tok.train_from_iterator(texts, trainer)
    tok.save(str(directory / "tokenizer.json"))
    config = {"bos_token": "<|bos|>", "eos_token": "<|eos|>", "add_bos_token": False, "add_eos_token": True}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def _titan_base():
    from torchtitan.components.tokenizer import BaseTokenizer

    return BaseTokenizer


class SentencePieceForTitan:
    """detsampler's sentencepiece tokenizer behind torchtitan's ``BaseTokenizer`` interface (made a subclass on first
    use, so this module imports without torchtitan): the same tokenizer as detsampler's rows, for a like-for-like
    row."""

    def __new__(cls, tokenizer: Any):
        base = _titan_base()

        class _SP(base):  # type: ignore[misc, valid-type]
            def __init__(self, tok: Any) -> None:
                super().__init__()
                self.tok, self.eos_id, self.bos_id = tok, tok.eos_id, None

            def encode(self, text: str, add_bos: bool = False, add_eos: bool = False, **_: Any) -> list[int]:
                ids = self.tok.encode(text)
                return [*ids, self.eos_id] if add_eos else ids

            def decode(self, ids: list[int], **_: Any) -> str:
                return self.tok.decode(ids)

            def get_vocab_size(self) -> int:
                return self.tok.vocab_size

        return _SP(tokenizer)


def titan_loader(name: str, hf_dataset_factory, tokenizer: Any, seq_len: int, batch_size: int, num_workers: int):
    """torchtitan's released ``HuggingFaceTextDataLoader`` over a dataset registered in its ``DATASETS`` table (the
    extension point its docs name): ``hf_dataset_factory(path)`` returns the Hugging Face dataset it streams."""
    _quiet()
    from torchtitan.hf_datasets import DatasetConfig
    from torchtitan.hf_datasets.text_datasets import DATASETS, HuggingFaceTextDataLoader

    DATASETS[name] = DatasetConfig(path=name, loader=hf_dataset_factory, sample_processor=lambda s: s["text"])
    config = HuggingFaceTextDataLoader.Config(dataset=name, num_workers=num_workers, infinite=True)
    return HuggingFaceTextDataLoader(
        config, dp_world_size=1, dp_rank=0, tokenizer=tokenizer, seq_len=seq_len, local_batch_size=batch_size
    )
