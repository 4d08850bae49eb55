"""Hugging Face tokenizers: a ``tokenizer.json`` through the ``tokenizers`` library (:class:`HFTokenizer`, the Rust
batch encoder with its own thread pool), a local ``transformers`` directory through ``AutoTokenizer``
(:class:`TransformersTokenizer`, optional: ``transformers`` is imported only when one is loaded), and training a small
byte-level BPE ``tokenizer.json`` locally (:func:`train_hf_bpe`).

Invariant: both are :class:`~detsampler.text.protocol.TokenizerLike`; ``encode_batch`` adds no special token; the
identity (``sha256``) is the hash of the tokenizer's files (see :func:`~detsampler.text.protocol.files_sha256`).
Nothing is downloaded.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from detsampler.text.protocol import describe_tokenizer, files_sha256

__all__ = ["HF_BPE_SPECIALS", "HFTokenizer", "TransformersTokenizer", "train_hf_bpe"]

# the special tokens of a tokenizer trained by train_hf_bpe, in id order (ids 0, 1, 2)
HF_BPE_SPECIALS = {"eos_token": "<|endoftext|>", "bos_token": "<|begin_of_text|>", "pad_token": "<|pad|>"}

# names a tokenizer.json's special tokens commonly have, tried in order when neither an argument nor a sibling
# tokenizer_config.json names them
_KNOWN = {
    "eos_token": ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>"),
    "bos_token": ("<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>"),
    "pad_token": ("<|pad|>", "<pad>", "[PAD]", "<|padding|>"),
}
# the files of a transformers tokenizer directory that define the tokenizer (weights and model configs excluded)
_TRANSFORMERS_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
    "spiece.model",
    "chat_template.jinja",
)


def _config_token(value: Any) -> str | None:
    """A special token of tokenizer_config.json: a string, or a dict with its ``content``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _sibling_config(path: Path) -> tuple[dict, Path | None]:
    config = path.with_name("tokenizer_config.json")
    if not config.is_file():
        return {}, None
    try:
        return json.loads(config.read_text()), config
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}, None


@dataclass(frozen=True, eq=False)
class HFTokenizer:
    """A ``tokenizer.json`` loaded with the ``tokenizers`` library. ``pad_id`` is ``eos_id`` when no pad token
    exists."""

    path: str
    sha256: str
    vocab_size: int
    eos_id: int
    bos_id: int | None
    pad_id: int
    specials: dict = field(repr=False)
    _json: str = field(repr=False)
    _tok: Any = field(repr=False)
    batch_docs: int = 256  # documents per encode_batch call: enough for the Rust thread pool, small enough to overlap

    @classmethod
    def load(
        cls,
        path: str | os.PathLike,
        *,
        eos_token: str | None = None,
        bos_token: str | None = None,
        pad_token: str | None = None,
    ) -> HFTokenizer:
        """Load ``path`` (a ``tokenizer.json``). Special tokens: the arguments, else a ``tokenizer_config.json``
        beside it, else a common name found in the vocabulary; no EOS token is a ValueError."""
        p = Path(path)
        if not p.is_file():
            raise ValueError(
                f"tokenizer: no tokenizer.json at {str(p)!r}; pass the path of a Hugging Face tokenizer.json, "
                "or train one with `detsampler tokenizer train --kind hf-bpe`"
            )
        config, config_path = _sibling_config(p)
        given = {"eos_token": eos_token, "bos_token": bos_token, "pad_token": pad_token}
        names = {k: v if v is not None else _config_token(config.get(k)) for k, v in given.items()}
        files = [p] + (
            [config_path] if config_path is not None and any(given[k] is None and names[k] for k in names) else []
        )
        return cls._make(p.read_text(), str(p), files_sha256(files), names)

    @classmethod
    def _make(cls, text: str, path: str, sha256: str, names: dict) -> HFTokenizer:
        from tokenizers import Tokenizer as RustTokenizer

        try:
            tok = RustTokenizer.from_str(text)
        except Exception as exc:  # the Rust side raises a bare Exception
            raise ValueError(f"tokenizer: {path!r} is not a Hugging Face tokenizer.json ({exc})") from None
        ids = {k: _token_id(tok, k, v, path) for k, v in names.items()}
        if ids["eos_token"] is None:
            raise ValueError(
                f"tokenizer: {path!r} has no EOS token (none of {', '.join(_KNOWN['eos_token'])} and no "
                "tokenizer_config.json beside it naming one); pass eos_token="
            )
        resolved = {k: tok.id_to_token(i) for k, i in ids.items() if i is not None}
        pad = ids["pad_token"] if ids["pad_token"] is not None else ids["eos_token"]
        return cls(
            path=path,
            sha256=sha256,
            vocab_size=int(tok.get_vocab_size(with_added_tokens=True)),
            eos_id=ids["eos_token"],
            bos_id=ids["bos_token"],
            pad_id=pad,
            specials=resolved,
            _json=text,
            _tok=tok,
        )

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text, no special token added (the Rust encoder, parallel over the batch)."""
        return [e.ids for e in self._tok.encode_batch_fast(list(texts), add_special_tokens=False)]

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def describe(self) -> dict:
        return describe_tokenizer(self, "hf")

    def __reduce__(self):
        return (_hf_from_state, (self._json, self.path, self.sha256, {f"{k}": v for k, v in self.specials.items()}))


def _hf_from_state(text: str, path: str, sha256: str, names: dict) -> HFTokenizer:
    return HFTokenizer._make(text, path, sha256, {k: names.get(k) for k in _KNOWN})


def _token_id(tok: Any, kind: str, name: str | None, path: str) -> int | None:
    """The id of the special token ``name`` (an error when named but absent), or of the first known name present."""
    if name is not None:
        i = tok.token_to_id(name)
        if i is None:
            raise ValueError(f"tokenizer: {path!r} has no token {name!r} (asked for as its {kind})")
        return int(i)
    for candidate in _KNOWN[kind]:
        i = tok.token_to_id(candidate)
        if i is not None:
            return int(i)
    return None


@dataclass(frozen=True, eq=False)
class TransformersTokenizer:
    """A local directory loaded with ``transformers.AutoTokenizer`` (``local_files_only``: nothing is downloaded)."""

    path: str
    sha256: str
    vocab_size: int
    eos_id: int
    bos_id: int | None
    pad_id: int
    _tok: Any = field(repr=False)

    @classmethod
    def load(cls, path: str | os.PathLike) -> TransformersTokenizer:
        p = Path(path)
        files = [p / name for name in _TRANSFORMERS_FILES if (p / name).is_file()]
        if not p.is_dir() or not files:
            raise ValueError(
                f"tokenizer: {str(p)!r} is not a transformers tokenizer directory (none of "
                f"{', '.join(_TRANSFORMERS_FILES[:3])}, ... in it)"
            )
        try:
            from transformers import AutoTokenizer
        except ImportError:
            raise ValueError(
                "tokenizer: loading a tokenizer directory needs transformers: pip install "
                "'detsampler[transformers]', or pass the directory's tokenizer.json file"
            ) from None
        tok = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
        if tok.eos_token_id is None:
            raise ValueError(f"tokenizer: {str(p)!r} defines no eos_token; set one in its tokenizer_config.json")
        eos = int(tok.eos_token_id)
        return cls(
            path=str(p),
            sha256=files_sha256(files),
            vocab_size=len(tok),
            eos_id=eos,
            bos_id=None if tok.bos_token_id is None else int(tok.bos_token_id),
            pad_id=eos if tok.pad_token_id is None else int(tok.pad_token_id),
            _tok=tok,
        )

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self._tok(list(texts), add_special_tokens=False, return_attention_mask=False)["input_ids"]

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode([int(i) for i in ids])

    def describe(self) -> dict:
        return describe_tokenizer(self, "transformers")

    def __reduce__(self):
        return (TransformersTokenizer.load, (self.path,))


def train_hf_bpe(texts: Iterable[str], vocab_size: int, out_dir: str | os.PathLike) -> HFTokenizer:
    """Train a byte-level BPE ``tokenizer.json`` (GPT-2 style: every text encodes, no unknown token) on ``texts`` and
    write it with a ``tokenizer_config.json`` (so ``transformers.AutoTokenizer`` loads the directory too) into
    ``out_dir``.

    Special tokens: ``<|endoftext|>`` 0 (EOS), ``<|begin_of_text|>`` 1 (BOS), ``<|pad|>`` 2. Deterministic for the same
    texts and vocabulary size.
    """
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 300:
        raise ValueError(f"vocab_size must be an integer >= 300 (256 bytes + specials + merges), got {vocab_size!r}")
    tok = RustTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(HF_BPE_SPECIALS.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator((t for t in texts if isinstance(t, str)), trainer=trainer)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1 << 30, **HF_BPE_SPECIALS}
    for name, text in (
        ("tokenizer.json", tok.to_str()),
        ("tokenizer_config.json", json.dumps(config, indent=2) + "\n"),
    ):
        tmp = out / f".{name}.tmp-{os.getpid()}"
        tmp.write_text(text)
        os.replace(tmp, out / name)
    return HFTokenizer.load(out / "tokenizer.json")
