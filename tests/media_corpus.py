"""Small interleaved image-text corpora for the media tests, made on the spot: a byte-level BPE tokenizer with the
Qwen2-VL image tokens, and the same documents as a ``datasets`` table with the ``Image`` feature, a parquet file, a
directory of image files with a JSONL of paths, and webdataset tar shards (written by webdataset's own
``TarWriter``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from detsampler.text.hf import HFTokenizer
from train.vlm_corpus import (
    EXTENSIONS,
    IMAGE,
    VLM_CHAT_TEMPLATE,
    chat_corpus_documents,
    image_bytes,
    make_vlm_chat_tokenizer,
    make_vlm_tokenizer,
    write_shards,
)

__all__ = [
    "EXTENSIONS",
    "VLM_CHAT_TEMPLATE",
    "chat_corpus_documents",
    "chat_to_dataset",
    "documents",
    "qwen2_vl_processor",
    "to_dataset",
    "to_directory",
    "to_shards",
    "vlm_chat_tokenizer",
    "vlm_tokenizer",
]

# fmt: off
WORDS = ("the", "cat", "sat", "on", "a", "mat", "while", "data", "loaders", "decode", "every", "image", "twice",
         "and", "pack", "tokens", "exactly", "into", "samples", "of", "fixed", "length", "so", "resuming", "needs")
# fmt: on


def vlm_tokenizer(directory: Path) -> HFTokenizer:
    """A byte-level BPE ``tokenizer.json`` of 400 pieces whose specials include ``<|image_pad|>``."""
    return make_vlm_tokenizer(directory, [" ".join(WORDS)] * 20, vocab_size=400)


def vlm_chat_tokenizer(directory: Path):
    """A ``transformers`` tokenizer directory of 400 pieces with the Qwen2-VL specials and an image-aware chat template
    (``train.vlm_corpus.VLM_CHAT_TEMPLATE``: assistant turns in ``{% generation %}``)."""
    return make_vlm_chat_tokenizer(directory, [" ".join(WORDS)] * 20, vocab_size=400)


def chat_to_dataset(docs: list[dict]):
    """A ``datasets.Dataset`` of ``messages`` (content parts) and ``images`` (a list of ``Image`` features)."""
    import datasets

    part = {"type": datasets.Value("string"), "text": datasets.Value("string")}
    features = datasets.Features({
        "messages": datasets.List({"role": datasets.Value("string"), "content": datasets.List(part)}),
        "images": datasets.List(datasets.Image()),
    })  # fmt: skip
    rows = {"messages": [d["messages"] for d in docs],
            "images": [[{"bytes": im["bytes"], "path": None} for im in d["images"]] for d in docs]}  # fmt: skip
    return datasets.Dataset.from_dict(rows, features=features)


def qwen2_vl_processor(tokenizer, image_processor, chat_template: str = VLM_CHAT_TEMPLATE):
    """transformers' own ``Qwen2VLProcessor`` made from explicit parts (nothing downloaded): ``tokenizer`` (a
    ``TransformersTokenizer``'s) and ``image_processor``. NOTE: the class without its video processor, whose module
    needs torchvision (not installed): ``__init__``'s signature names the parts a processor holds; the chat template,
    the token expansion and the assistant masks are the class's own code."""
    from transformers import Qwen2VLProcessor

    class ImageQwen2VLProcessor(Qwen2VLProcessor):
        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            super().__init__(image_processor, tokenizer, chat_template=chat_template, **kwargs)

    return ImageQwen2VLProcessor(image_processor=image_processor, tokenizer=tokenizer._tok, chat_template=chat_template)


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
    return write_shards(docs, root, per_shard)
