"""A local interleaved image-text corpus for ``make demo-vlm`` and the VLM tests: nothing is downloaded.

    python -m train.vlm_corpus [--out .cache/vlm-corpus] [--documents 400] [--seed 0]

writes ``OUT/shards/shard-NNNNN.tar`` (webdataset shards, written by webdataset's own ``TarWriter``: sample ``KEY``
holds ``KEY.txt`` and ``KEY.<i>.<jpg|png|webp>`` per image) and ``OUT/tokenizer/tokenizer.json``, a 512-piece
byte-level BPE trained on the same text whose special tokens are Qwen2-VL's (``<|vision_start|>``, ``<|image_pad|>``,
``<|vision_end|>``). The text is sentences of this interpreter's ``os.py``; each document holds 0 to 3 images between
them, of 16² to 320² pixels in area (aspect ratios up to 8:1), with EXIF orientations 1, 3, 6 or 8 (or none), as JPEG,
PNG or WebP, their pixels a seeded pattern.

Invariant: the same arguments write byte-identical files, so the media index's cache key and the data fingerprint of a
rebuilt corpus are those of the first build.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "IMAGE",
    "VLM_CHAT_SPECIALS",
    "VLM_CHAT_TEMPLATE",
    "VLM_SPECIALS",
    "chat_corpus_documents",
    "corpus_documents",
    "image_bytes",
    "make_vlm_chat_tokenizer",
    "make_vlm_tokenizer",
    "write_chat_shards",
    "write_shards",
    "write_vlm_chat_corpus",
    "write_vlm_corpus",
]

VLM_SPECIALS = ["<|endoftext|>", "<|pad|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>"]
VLM_CHAT_SPECIALS = [*VLM_SPECIALS, "<|im_start|>", "<|im_end|>"]
IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
# Qwen2-VL's turns and image parts, each assistant turn wrapped in {% generation %} (what the loss policies read);
# a content is a string or a list of {"type": "image"} and {"type": "text", "text": ...} parts
VLM_CHAT_TEMPLATE = (
    "{% macro render(content) %}{% if content is string %}{{ content }}{% else %}{% for part in content %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}{% endmacro %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ render(m['content']) }}<|im_end|>{% endgeneration %}"
    "{% else %}{{ render(m['content']) }}<|im_end|>{% endif %}\n{% endfor %}"
)
EXTENSIONS = {"JPEG": "jpg", "PNG": "png", "WEBP": "webp"}


def _sentences() -> list[str]:
    """Lines of this interpreter's ``os.py`` with letters in them: the text of every document."""
    lines = [" ".join(line.split()) for line in Path(os.__file__).read_text().splitlines()]
    return [line for line in lines if sum(c.isalpha() for c in line) > 10][:4000]


def make_vlm_tokenizer(out_dir: str | Path, texts: Sequence[str] | None = None, vocab_size: int = 512) -> Any:
    """A byte-level BPE ``tokenizer.json`` whose specials are :data:`VLM_SPECIALS`, trained on ``texts`` (default: the
    corpus's sentences), loaded as an :class:`~detsampler.text.hf.HFTokenizer`."""
    from detsampler.text.hf import HFTokenizer

    path = Path(out_dir) / "tokenizer.json"
    _train_bpe(path, texts, vocab_size, VLM_SPECIALS)
    return HFTokenizer.load(path, eos_token="<|endoftext|>", pad_token="<|pad|>")


def _train_bpe(path: Path, texts: Sequence[str] | None, vocab_size: int, specials: list[str]) -> None:
    """Train a byte-level BPE ``tokenizer.json`` at ``path`` with ``specials`` first (once: an existing one is kept)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if not path.is_file():
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(list(texts) if texts is not None else _sentences(), trainer=trainer)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".tokenizer.json.tmp-{os.getpid()}")
        tmp.write_text(tok.to_str())
        os.replace(tmp, path)


def make_vlm_chat_tokenizer(out_dir: str | Path, texts: Sequence[str] | None = None, vocab_size: int = 512) -> Any:
    """A ``transformers`` tokenizer directory: a byte-level BPE whose specials are :data:`VLM_CHAT_SPECIALS` and whose
    chat template is :data:`VLM_CHAT_TEMPLATE`, loaded as a :class:`~detsampler.text.hf.TransformersTokenizer`."""
    import json

    from detsampler.text.hf import TransformersTokenizer

    out = Path(out_dir)
    _train_bpe(out / "tokenizer.json", texts, vocab_size, VLM_CHAT_SPECIALS)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1 << 30, "eos_token": "<|endoftext|>",
              "pad_token": "<|pad|>", "chat_template": VLM_CHAT_TEMPLATE}  # fmt: skip
    text = json.dumps(config, indent=2, sort_keys=True) + "\n"
    path = out / "tokenizer_config.json"
    if not path.is_file() or path.read_text() != text:
        tmp = path.with_name(f".tokenizer_config.json.tmp-{os.getpid()}")
        tmp.write_text(text)
        os.replace(tmp, path)
    return TransformersTokenizer.load(out)


def image_bytes(fmt: str, width: int, height: int, orientation: int | None = None, seed: int = 0) -> bytes:
    """An image stored as ``width`` x ``height`` pixels (before orientation) in ``fmt``, with the EXIF orientation tag
    ``orientation`` when given; its pixels a seeded gradient with noise."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // max(width, 1), y * 255 // max(height, 1), (x + y) % 256], axis=-1)
    pixels = (base + rng.integers(0, 32, size=base.shape)).clip(0, 255).astype(np.uint8)
    buf = io.BytesIO()
    kwargs: dict[str, Any] = {"quality": 90} if fmt in ("JPEG", "WEBP") else {}
    if orientation is not None:
        exif = Image.Exif()
        exif[0x0112] = orientation
        kwargs["exif"] = exif.tobytes()
    Image.fromarray(pixels, "RGB").save(buf, fmt, **kwargs)
    return buf.getvalue()


def corpus_documents(num: int, seed: int = 0, max_images: int = 3, smallest: int = 16, largest: int = 320) -> list:
    """``num`` documents ``{"text", "images": [{"format", "orientation", "bytes"}]}``: 1 to 6 sentences with 0 to
    ``max_images`` image placeholders between them."""
    rng = np.random.default_rng(seed)
    sentences = _sentences()
    out = []
    for d in range(num):
        parts = [sentences[int(i)] for i in rng.integers(0, len(sentences), size=int(rng.integers(1, 7)))]
        images = []
        for i in range(int(rng.integers(0, max_images + 1))):
            fmt = ("JPEG", "PNG", "WEBP")[int(rng.integers(0, 3))]
            side = int(np.exp(rng.uniform(np.log(smallest), np.log(largest))))
            ratio = float(np.exp(rng.uniform(-np.log(8), np.log(8))))
            w, h = max(smallest, int(side * ratio**0.5)), max(smallest, int(side / ratio**0.5))
            orientation = (None, 1, 3, 6, 8)[int(rng.integers(0, 5))]
            images.append({"format": fmt, "orientation": orientation,
                           "bytes": image_bytes(fmt, w, h, orientation, seed=seed * 100_000 + d * 10 + i)})  # fmt: skip
            parts.insert(int(rng.integers(0, len(parts) + 1)), IMAGE)
        out.append({"text": " ".join(parts), "images": images})
    return out


def _random_image(rng: np.random.Generator, seed: int, smallest: int, largest: int) -> dict:
    """One image ``{"format", "orientation", "bytes"}``: a seeded size, aspect ratio (up to 8:1), format and EXIF
    orientation."""
    fmt = ("JPEG", "PNG", "WEBP")[int(rng.integers(0, 3))]
    side = int(np.exp(rng.uniform(np.log(smallest), np.log(largest))))
    ratio = float(np.exp(rng.uniform(-np.log(8), np.log(8))))
    w, h = max(smallest, int(side * ratio**0.5)), max(smallest, int(side / ratio**0.5))
    orientation = (None, 1, 3, 6, 8)[int(rng.integers(0, 5))]
    return {"format": fmt, "orientation": orientation, "bytes": image_bytes(fmt, w, h, orientation, seed=seed)}


def chat_corpus_documents(num: int, seed: int = 0, max_images: int = 2, smallest: int = 16, largest: int = 160) -> list:
    """``num`` conversations ``{"messages", "images"}`` in the shape transformers' chat templates and processors take:
    an optional system turn, then 1 to 3 user/assistant exchanges; each content a list of ``{"type": "text", "text"}``
    and ``{"type": "image"}`` parts (0 to ``max_images`` images per user turn, before, between or after its text);
    ``images``: the images in the order of their parts."""
    rng = np.random.default_rng(seed)
    sentences = _sentences()

    def say() -> dict:
        return {"type": "text", "text": sentences[int(rng.integers(0, len(sentences)))]}

    out = []
    for d in range(num):
        messages = [{"role": "system", "content": [say()]}] if rng.random() < 0.3 else []
        images: list[dict] = []
        for _ in range(int(rng.integers(1, 4))):
            parts = [say()]
            for _ in range(int(rng.integers(0, max_images + 1))):
                images.append(_random_image(rng, seed * 100_000 + d * 10 + len(images), smallest, largest))
                parts.insert(int(rng.integers(0, len(parts) + 1)), {"type": "image", "text": None})
            messages += [{"role": "user", "content": parts}, {"role": "assistant", "content": [say()]}]
        out.append({"messages": messages, "images": images})
    return out


def _write_samples(docs: list, root: Path, per_shard: int, fields: Callable[[dict], dict]) -> list[Path]:
    """webdataset shards of ``docs`` under ``root``, ``per_shard`` samples each, each written whole and renamed into
    place: sample ``KEY`` holds ``fields(doc)`` and ``KEY.<i>.<ext>`` per image, numbered in the document's order."""
    import webdataset as wds

    root.mkdir(parents=True, exist_ok=True)
    shards = []
    for s in range(0, len(docs), per_shard):
        path = root / f"shard-{s // per_shard:05d}.tar"
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        with wds.TarWriter(str(tmp)) as sink:
            for d in range(s, min(s + per_shard, len(docs))):
                sample = {"__key__": f"{d:06d}", **fields(docs[d])}
                for i, im in enumerate(docs[d]["images"]):
                    sample[f"{i}.{EXTENSIONS[im['format']]}"] = im["bytes"]
                sink.write(sample)
        os.replace(tmp, path)
        shards.append(path)
    return shards


def write_shards(docs: list, root: Path, per_shard: int = 100) -> list[Path]:
    """webdataset shards of ``docs`` under ``root``: sample ``KEY`` holds ``KEY.txt`` and ``KEY.<i>.<ext>``."""
    return _write_samples(docs, root, per_shard, lambda doc: {"txt": doc["text"]})


def write_chat_shards(docs: list, root: Path, per_shard: int = 100, wrapped: bool = False) -> list[Path]:
    """webdataset shards of chat ``docs`` (:func:`chat_corpus_documents`) under ``root``: sample ``KEY`` holds
    ``KEY.json`` (the ``messages`` list, or ``{"messages": [...]}`` when ``wrapped``) and ``KEY.<i>.<ext>`` per image,
    numbered in the order of the conversation's image parts."""
    import json

    def fields(doc: dict) -> dict:
        return {"json": json.dumps({"messages": doc["messages"]} if wrapped else doc["messages"])}

    return _write_samples(docs, root, per_shard, fields)


def write_vlm_corpus(out_dir: str | Path, num_documents: int = 400, seed: int = 0) -> tuple[list[Path], Any]:
    """The shards and the tokenizer under ``out_dir`` (written once: an existing corpus is reused)."""
    out = Path(out_dir)
    tokenizer = make_vlm_tokenizer(out / "tokenizer")
    done = out / "shards" / "COMPLETE"
    if done.is_file() and done.read_text() == f"{num_documents} {seed}\n":
        return sorted((out / "shards").glob("shard-*.tar")), tokenizer
    shards = write_shards(corpus_documents(num_documents, seed), out / "shards")
    done.write_text(f"{num_documents} {seed}\n")
    return shards, tokenizer


def write_vlm_chat_corpus(out_dir: str | Path, num_documents: int = 400, seed: int = 0) -> tuple[list[Path], Any]:
    """The corpus as conversations (:func:`chat_corpus_documents`, in :func:`write_chat_shards`'s shards) under
    ``out_dir/chat`` and its chat tokenizer (:func:`make_vlm_chat_tokenizer`), written once: an existing one is
    reused."""
    out = Path(out_dir) / "chat"
    tokenizer = make_vlm_chat_tokenizer(out / "tokenizer")
    done = out / "shards" / "COMPLETE"
    if done.is_file() and done.read_text() == f"{num_documents} {seed}\n":
        return sorted((out / "shards").glob("shard-*.tar")), tokenizer
    shards = write_chat_shards(chat_corpus_documents(num_documents, seed), out / "shards")
    done.write_text(f"{num_documents} {seed}\n")
    return shards, tokenizer


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m train.vlm_corpus", description=__doc__.split("\n")[0])
    p.add_argument("--out", default=".cache/vlm-corpus")
    p.add_argument("--documents", type=int, default=400)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    shards, _ = write_vlm_corpus(args.out, args.documents, args.seed)
    print(f"{len(shards)} shards, {args.documents} documents under {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
