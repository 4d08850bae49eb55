"""Sentencepiece tokenizers: load one from a path (recording its sha256, vocabulary size, EOS and pad ids) or train one.

A :class:`Tokenizer` is identified by the sha256 of its model file: an index records it and refuses a different model.
It pickles as its serialized model (not as a path), so DataLoader workers and build processes get exactly the same
model.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import sentencepiece as spm

from detsampler.atomic import atomic_write
from detsampler.checks import check_int
from detsampler.text.file_kinds import corpus_kind
from detsampler.text.protocol import describe_tokenizer

__all__ = ["Tokenizer", "iter_training_lines", "read_inputs", "read_training_texts", "train_tokenizer"]

# Lines longer than this (bytes) are skipped by the trainer (sentencepiece's own limit is max_sentence_length).
_MAX_LINE_BYTES = 16384


def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True, eq=False)
class Tokenizer:
    """A loaded sentencepiece model (a :class:`~detsampler.text.protocol.TokenizerLike`). ``pad_id`` is the model's pad
    id,
    or ``eos_id`` when the model defines none; ``bos_id`` is None when it defines no BOS."""

    path: str
    sha256: str
    vocab_size: int
    eos_id: int
    pad_id: int
    _model: bytes = field(repr=False)
    _sp: spm.SentencePieceProcessor = field(repr=False)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Tokenizer:
        """Load the sentencepiece model at ``path``; a missing file or a file that is not a model is a ValueError."""
        p = Path(path)
        if not p.is_file():
            raise ValueError(
                f"tokenizer: no sentencepiece model file at {str(p)!r}; pass the path of a .model file, or train one"
                " with `detsampler tokenizer train --input FILES_OR_DIR --vocab-size N --out PATH`"
            )
        return cls.from_bytes(p.read_bytes(), str(p))

    @classmethod
    def from_bytes(cls, model: bytes, path: str = "<memory>") -> Tokenizer:
        """A tokenizer from a serialized sentencepiece model (the bytes of a .model file)."""
        sp = spm.SentencePieceProcessor()
        try:
            sp.LoadFromSerializedProto(model)
        except (RuntimeError, OSError, TypeError) as exc:
            raise ValueError(
                f"tokenizer: {path!r} is not a sentencepiece model ({exc}); pass a .model file written by the"
                " sentencepiece trainer or `detsampler tokenizer train`"
            ) from None
        eos = int(sp.eos_id())
        if eos < 0:
            raise ValueError(
                f"tokenizer: the model {path!r} has no EOS token (eos_id=-1); train it with an eos_id >= 0"
            )
        pad = int(sp.pad_id())
        return cls(
            path=path,
            sha256=_sha256_bytes(model),
            vocab_size=int(sp.GetPieceSize()),
            eos_id=eos,
            pad_id=pad if pad >= 0 else eos,
            _model=model,
            _sp=sp,
        )

    def encode_batch(self, texts: Sequence[str], num_threads: int = 1) -> list[list[int]]:
        """Token ids of each text (no BOS/EOS added: the index adds a virtual EOS after each document)."""
        return self._sp.Encode(list(texts), out_type=int, num_threads=num_threads)

    def encode(self, text: str) -> list[int]:
        return self._sp.Encode(text, out_type=int)

    @property
    def bos_id(self) -> int | None:
        bos = int(self._sp.bos_id())
        return bos if bos >= 0 else None

    def decode(self, ids: Sequence[int]) -> str:
        return self._sp.Decode([int(i) for i in ids])

    def describe(self) -> dict:
        return describe_tokenizer(self, "sentencepiece")

    def __reduce__(self):
        return (Tokenizer.from_bytes, (self._model, self.path))


def iter_training_lines(
    texts: Iterable[str], max_lines: int | None = None, total_lines: int | None = None
) -> Iterator[str]:
    """The non-blank lines of ``texts`` (each shorter than the trainer's limit), every k-th one when ``max_lines`` caps
    them.

    The subsampling is a fixed stride, so the lines (and the trained model) are a pure function of the texts.
    """
    stride = 1
    if max_lines is not None and total_lines is not None and total_lines > max_lines:
        stride = -(-total_lines // max_lines)
    i = 0
    for text in texts:
        if not isinstance(text, str):
            continue
        for line in text.split("\n"):
            if not line.strip() or len(line.encode("utf-8", "replace")) > _MAX_LINE_BYTES:
                continue
            if i % stride == 0:
                yield line
            i += 1


def _input_files(inputs: Sequence[str | os.PathLike] | str | os.PathLike) -> list[Path]:
    """The files of ``inputs`` (files, and every file under a directory, sorted), in order; none is a ValueError."""
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    files: list[Path] = []
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            files.extend(sorted(f for f in p.rglob("*") if f.is_file()))
        elif p.is_file():
            files.append(p)
        else:
            raise ValueError(f"tokenizer train: input {str(p)!r} is neither a file nor a directory")
    if not files:
        raise ValueError(f"tokenizer train: no input files in {[str(i) for i in inputs]}")
    return files


def read_inputs(inputs: Sequence[str | os.PathLike] | str | os.PathLike) -> list[str]:
    return [f.read_bytes().decode("utf-8", "replace") for f in _input_files(inputs)]


def read_training_texts(
    inputs: Sequence[str | os.PathLike] | str | os.PathLike, text_column: str = "text"
) -> list[str]:
    """The texts to train a tokenizer on: of each json/jsonl file (any suffix case, ``.gz``/``.bz2``/``.xz``
    compressed), the ``text_column`` of every record; of each parquet file, that column; of any other file, its whole
    text (as :func:`read_inputs`). Files in the order :func:`read_inputs` takes them; a record without the column is a
    ValueError naming the file and line."""
    import bz2
    import gzip
    import json
    import lzma

    files = _input_files(inputs)
    openers = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}
    texts: list[str] = []
    for f in files:
        kind = corpus_kind(f)
        if kind == "parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(f)
            if text_column not in table.column_names:
                raise ValueError(
                    f"tokenizer train: {str(f)!r} has no {text_column!r} column (columns:"
                    f" {', '.join(sorted(table.column_names))}); pass --text-column"
                )
            texts.extend(t for t in table.column(text_column).to_pylist() if isinstance(t, str))
            continue
        with openers.get(f.suffix.lower(), open)(f, "rb") as handle:
            raw = handle.read().decode("utf-8", "replace")
        if kind != "json":
            texts.append(raw)
            continue
        stripped = raw.lstrip()
        records = json.loads(stripped) if stripped.startswith("[") else None
        rows = enumerate(records, 1) if records is not None else enumerate(raw.splitlines(), 1)
        for number, row in rows:
            if records is None:
                if not row.strip():
                    continue
                row = json.loads(row)
            if not isinstance(row, dict) or text_column not in row:
                columns = ", ".join(sorted(row)) if isinstance(row, dict) else type(row).__name__
                where = "record" if records is not None else "line"
                raise ValueError(
                    f"tokenizer train: {str(f)!r} {where} {number} has no {text_column!r} column (columns: {columns});"
                    " pass --text-column"
                )
            if isinstance(row[text_column], str):
                texts.append(row[text_column])
    return texts


def _check_writable(directory: Path) -> None:
    """Raise ValueError before any work when ``directory`` cannot be created or written."""
    existing = directory.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"tokenizer train: cannot create {str(directory)!r}: {str(existing)!r} is a file")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"tokenizer train: cannot write under {str(existing)!r}: permission denied")


def train_tokenizer(
    inputs: Sequence[str | os.PathLike] | str | os.PathLike | None,
    vocab_size: int,
    out_path: str | os.PathLike,
    *,
    texts: Iterable[str] | None = None,
    max_lines: int = 400_000,
    num_threads: int = 1,
) -> Tokenizer:
    """Train a BPE sentencepiece model on the lines of ``inputs`` (files or directories, read recursively) or ``texts``.

    Byte fallback is on (every text encodes, no unknown tokens), normalization is the identity and whitespace is kept,
    so decoding reproduces source code exactly; ``"\\n"`` is a token of its own. Ids: unk 0, bos 1, eos 2, pad 3. The
    model is written to ``out_path`` atomically (a temporary file renamed into place).
    """
    check_int(vocab_size, "vocab_size (256 byte pieces + specials + merges)", minimum=300)
    out = Path(out_path)
    if out.is_dir() or str(out_path).endswith(os.sep):
        raise ValueError(f"tokenizer train: --out {str(out_path)!r} is a directory; name the .model file to write")
    _check_writable(out.parent)
    if texts is None:
        if inputs is None:
            raise ValueError("tokenizer train: pass inputs (files or directories) or texts")
        texts = read_inputs(inputs)
    texts = list(texts)
    total = sum(t.count("\n") + 1 for t in texts if isinstance(t, str))
    lines = iter_training_lines(texts, max_lines=max_lines, total_lines=total)
    buf = io.BytesIO()
    try:
        spm.SentencePieceTrainer.Train(
            sentence_iterator=lines,
            model_writer=buf,
            vocab_size=vocab_size,
            model_type="bpe",
            byte_fallback=True,
            normalization_rule_name="identity",
            remove_extra_whitespaces=False,
            allow_whitespace_only_pieces=True,
            split_digits=True,
            user_defined_symbols=["\n"],
            unk_id=0,
            bos_id=1,
            eos_id=2,
            pad_id=3,
            num_threads=num_threads,
            max_sentence_length=_MAX_LINE_BYTES,
            input_sentence_size=0,
            minloglevel=2,
        )
    except RuntimeError as exc:
        raise ValueError(
            f"tokenizer train: sentencepiece failed ({exc}); a smaller --vocab-size or more text may help"
        ) from None
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, buf.getvalue())
    return Tokenizer.load(out)
