"""Small interleaved image-text corpora for the media tests, made on the spot: a byte-level BPE tokenizer with the
Qwen2-VL image tokens, and the same documents as a ``datasets`` table with the ``Image`` feature, a parquet file, a
directory of image files with a JSONL of paths, and webdataset tar shards (written by webdataset's own
``TarWriter``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from detsampler.text.hf import HFTokenizer
from tests.media_images import image_bytes

__all__ = ["EXTENSIONS", "VLM_SPECIALS", "documents", "to_dataset", "to_directory", "to_shards", "vlm_tokenizer"]

VLM_SPECIALS = ["<|endoftext|>", "<|pad|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>"]
IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
EXTENSIONS = {"JPEG": "jpg", "PNG": "png", "WEBP": "webp"}
# fmt: off
WORDS = ("the", "cat", "sat", "on", "a", "mat", "while", "data", "loaders", "decode", "every", "image", "twice",
         "and", "pack", "tokens", "exactly", "into", "samples", "of", "fixed", "length", "so", "resuming", "needs")
# fmt: on


def vlm_tokenizer(directory: Path) -> HFTokenizer:
    """A byte-level BPE ``tokenizer.json`` of 400 pieces whose specials include ``<|image_pad|>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    path = Path(directory) / "tokenizer.json"
    if not path.is_file():
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=400, special_tokens=VLM_SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )  # fmt: skip
        tok.train_from_iterator([" ".join(WORDS)] * 20, trainer=trainer)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(tok.to_str())
    return HFTokenizer.load(path, eos_token="<|endoftext|>", pad_token="<|pad|>")


def documents(n: int, seed: int = 0, max_images: int = 3, largest: int = 96) -> list[dict]:
    """``n`` documents: text with ``IMAGE`` placeholders between words, and per image its format, stored size, EXIF
    orientation and bytes (made by Pillow)."""
    rng = np.random.default_rng(seed)
    out = []
    for d in range(n):
        k = int(rng.integers(0, max_images + 1))
        images = []
        for i in range(k):
            fmt = ("JPEG", "PNG", "WEBP")[int(rng.integers(0, 3))]
            w, h = (int(x) for x in rng.integers(8, largest, size=2))
            orientation = [None, 1, 3, 6, 8][int(rng.integers(0, 5))]
            images.append(
                {
                    "format": fmt,
                    "orientation": orientation,
                    "bytes": image_bytes(fmt, w, h, orientation, seed * 1000 + d * 10 + i),
                }
            )
        words = [str(rng.choice(WORDS)) for _ in range(int(rng.integers(3, 40)))]
        slots = sorted(rng.integers(0, len(words) + 1, size=k).tolist())
        parts, prev = [], 0
        for s in slots:
            parts += words[prev:s] + [IMAGE]
            prev = s
        parts += words[prev:]
        out.append({"text": " ".join(parts), "images": images})
    return out


def to_dataset(docs: list[dict]):
    """A ``datasets.Dataset`` with a text column and a list of ``Image`` features (bytes inside the table)."""
    import datasets

    features = datasets.Features({"text": datasets.Value("string"), "images": datasets.List(datasets.Image())})
    rows = {"text": [d["text"] for d in docs],
            "images": [[{"bytes": im["bytes"], "path": None} for im in d["images"]] for d in docs]}  # fmt: skip
    return datasets.Dataset.from_dict(rows, features=features)


def to_directory(docs: list[dict], root: Path) -> Path:
    """Image files under ``root/images/`` and ``root/docs.jsonl`` naming them by relative path."""
    (root / "images").mkdir(parents=True, exist_ok=True)
    with open(root / "docs.jsonl", "w") as f:
        for d, doc in enumerate(docs):
            names = []
            for i, im in enumerate(doc["images"]):
                name = f"images/{d:05d}_{i}.{EXTENSIONS[im['format']]}"
                (root / name).write_bytes(im["bytes"])
                names.append(name)
            f.write(json.dumps({"text": doc["text"], "images": names}) + "\n")
    return root / "docs.jsonl"


def to_shards(docs: list[dict], root: Path, per_shard: int = 4) -> list[Path]:
    """webdataset shards: sample ``key`` holds ``key.txt`` and ``key.<i>.<ext>`` per image."""
    import webdataset as wds

    root.mkdir(parents=True, exist_ok=True)
    shards = []
    for s in range(0, len(docs), per_shard):
        path = root / f"shard-{s // per_shard:05d}.tar"
        with wds.TarWriter(str(path)) as sink:
            for d in range(s, min(s + per_shard, len(docs))):
                sample = {"__key__": f"{d:06d}", "txt": docs[d]["text"]}
                for i, im in enumerate(docs[d]["images"]):
                    sample[f"{i}.{EXTENSIONS[im['format']]}"] = im["bytes"]
                sink.write(sample)
        shards.append(path)
    return shards
