"""Corpora as map-style Hugging Face ``datasets.Dataset`` objects, and the default corpus and tokenizer (no download).

The default corpus is the running interpreter's standard library: every ``*.py`` file under
``sysconfig.get_paths()["stdlib"]`` outside ``site-packages``, sorted by relative path, one document per file, with
columns ``text`` and ``path``. Its fingerprint is a sha256 of the paths and texts, so it is the same in every process
and changes exactly when a file does.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sysconfig
from pathlib import Path

import datasets
import pyarrow as pa
from filelock import FileLock

from detsampler.atomic import atomic_write
from detsampler.checks import check_local_path
from detsampler.text.file_kinds import EXTENSIONS, corpus_kind
from detsampler.text.fingerprint import content_fingerprint
from detsampler.text.tokenizer import Tokenizer, train_tokenizer

__all__ = [
    "DEFAULT_VOCAB_SIZE",
    "check_text_column",
    "corpus_files",
    "corpus_kind",
    "default_corpus",
    "default_tokenizer",
    "load_corpus",
    "stdlib_files",
]

logger = logging.getLogger("detsampler")

DEFAULT_VOCAB_SIZE = 8000


def stdlib_files(root: str | os.PathLike | None = None) -> list[tuple[str, Path]]:
    """``(relative posix path, file)`` of the standard library's ``.py`` sources outside
    site-packages, sorted by path."""
    base = Path(root if root is not None else sysconfig.get_paths()["stdlib"])
    found = []
    for p in base.rglob("*.py"):
        rel = p.relative_to(base)
        if "site-packages" in rel.parts or "dist-packages" in rel.parts or not p.is_file():
            continue
        found.append((rel.as_posix(), p))
    found.sort(key=lambda item: item[0])
    return found


def _dataset_from_columns(columns: dict[str, list], fingerprint: str) -> datasets.Dataset:
    table = datasets.table.InMemoryTable(pa.table(columns))
    return datasets.Dataset(table, fingerprint=fingerprint)


def default_corpus(max_documents: int | None = None, root: str | os.PathLike | None = None) -> datasets.Dataset:
    """The standard library's sources as a dataset (columns ``text``, ``path``); the first ``max_documents`` by path if
    given.

    Files are decoded as UTF-8 (the few that are not have undecodable bytes replaced). Deterministic across processes.
    """
    if max_documents is not None and (not isinstance(max_documents, int) or max_documents < 1):
        raise ValueError(f"max_documents must be an integer >= 1 or None, got {max_documents!r}")
    files = stdlib_files(root)
    if max_documents is not None:
        files = files[:max_documents]
    if not files:
        raise ValueError(f"default corpus: no .py files under {root or sysconfig.get_paths()['stdlib']!r}")
    paths = [rel for rel, _ in files]
    texts = [p.read_bytes().decode("utf-8", "replace") for _, p in files]
    h = hashlib.sha256(b"detsampler-stdlib-corpus-v1")
    for rel, text in zip(paths, texts):
        h.update(rel.encode())
        h.update(b"\0")
        h.update(text.encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    return _dataset_from_columns({"text": texts, "path": paths}, h.hexdigest()[:16])


def load_corpus(
    source: str | os.PathLike | None = None, text_column: str = "text", cache_dir: str | os.PathLike | None = None
) -> datasets.Dataset:
    """A corpus from ``source``: None for the default corpus; a directory written by ``Dataset.save_to_disk``; or local
    ``text`` (one document per file), ``json``/``jsonl`` or ``parquet`` files (a file, or a directory of them).

    The dataset's fingerprint is the content fingerprint of the source's files (:mod:`detsampler.text.fingerprint`), so
    it does not depend on where the corpus lies or on its files' times, and changes with every edit. ``cache_dir`` (the
    detsampler cache; None: ``$DETSAMPLER_CACHE`` or ``./.cache/detsampler``) keeps the per-file hashes, so that a
    normal open rehashes nothing, and Hugging Face's arrow cache of the parsed files, per content (its own cache is
    keyed by path and mtime, and would serve an edit with a restored mtime stale). ``text_column`` is only checked here,
    so that a missing column is reported before anything is built.
    """
    if source is not None and not str(source).strip():  # Path("") is the current directory: never that
        raise ValueError(f"data: got an empty path {source!r}; pass a file, a directory of files or None")
    if source is None:
        ds = default_corpus()
    else:
        ds = _load_local(Path(check_local_path(source, "data")), cache_dir)
    check_text_column(ds, text_column)
    return ds


def corpus_files(p: Path) -> list[Path]:
    """The corpus files of ``p``: ``[p]`` for a file; for a directory, every file under it (sorted; hidden files and
    directories, whose names start with ``.``, left out, as Hugging Face does), each of a readable kind (else a
    ValueError naming the files that would be left out: nothing is dropped silently)."""
    if not p.is_dir():
        return [p]
    files = sorted(
        f for f in p.rglob("*") if f.is_file() and not any(part.startswith(".") for part in f.relative_to(p).parts)
    )
    unreadable = [f for f in files if corpus_kind(f) is None]
    if unreadable:
        names = ", ".join(repr(str(f.relative_to(p))) for f in unreadable[:5])
        more = f" and {len(unreadable) - 5} more" if len(unreadable) > 5 else ""
        raise ValueError(
            f"data: {str(p)!r} holds {len(unreadable)} file(s) of no readable kind: {names}{more} (readable:"
            f" {', '.join(sorted(EXTENSIONS))}, any case, compressed with .bz2, .gz or .xz); move them out or pass"
            " the files to read"
        )
    return files


def _local_files(p: Path) -> tuple[str, list[Path]]:
    """The loader kind and the files of local source ``p`` (raises ValueError naming what is wrong)."""
    if p.is_dir() and (p / "claims").is_dir() and not (p / "manifest.json").is_file():
        raise ValueError(
            f"data: {str(p)!r} is a sharded index directory without its manifest.json (its shards are not all "
            "built, or it was never finalized): run the missing --shard tasks or build --finalize"
        )
    if not p.exists():
        raise ValueError(
            f"data: {str(p)!r} does not exist; pass a file, a directory of files or a save_to_disk directory"
        )
    if p.is_dir() and (p / "dataset_dict.json").is_file():
        splits = sorted(d.name for d in p.iterdir() if d.is_dir())
        raise ValueError(f"data: {str(p)!r} holds a DatasetDict with splits {splits}; pass one split's directory")
    if p.is_dir() and ((p / "dataset_info.json").is_file() or (p / "state.json").is_file()):
        return "save_to_disk", sorted(f for f in p.rglob("*") if f.is_file())
    files = corpus_files(p)
    if not files:
        raise ValueError(f"data: no {sorted(EXTENSIONS)} files under {str(p)!r}")
    kinds = {corpus_kind(f) for f in files}
    if None in kinds or len(kinds) != 1:
        raise ValueError(
            f"data: {str(p)!r} must hold files of one kind among {sorted(EXTENSIONS)}, got suffixes "
            f"{sorted({''.join(f.suffixes[-2:]) for f in files})}"
        )
    return kinds.pop(), files


def _root_cause(exc: BaseException) -> str:
    """The innermost cause of ``exc`` as one line (Hugging Face wraps the parser's error in its own)."""
    while exc.__cause__ is not None or (exc.__context__ is not None and not exc.__suppress_context__):
        exc = exc.__cause__ or exc.__context__
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


def _default_cache_dir() -> Path:
    # NOTE: the same rule as detsampler.index.format.default_cache_dir (the index tier is above this one; a test pins
    # both)
    return Path(os.environ.get("DETSAMPLER_CACHE") or Path.cwd() / ".cache" / "detsampler")


def _load_local(p: Path, cache_dir: str | os.PathLike | None) -> datasets.Dataset:
    kind, files = _local_files(p)
    if kind != "save_to_disk" and all(f.stat().st_size == 0 for f in files):
        raise ValueError(f"data: {str(p)!r} holds no documents (its files are empty)")
    cache_dir = _default_cache_dir() if cache_dir is None else cache_dir
    fingerprint = content_fingerprint(p, files, kind, cache_dir).digest
    if kind == "save_to_disk":
        ds = datasets.load_from_disk(str(p))
        if isinstance(ds, datasets.DatasetDict):
            raise ValueError(f"data: {str(p)!r} holds a DatasetDict with splits {list(ds)}; pass one split's directory")
    else:
        extra: dict = {"sample_by": "document"} if kind == "text" else {}
        hf_dir = Path(cache_dir) / "hf-datasets" / fingerprint
        extra["cache_dir"] = str(hf_dir)
        for attempt in range(2):
            try:
                ds = datasets.load_dataset(kind, data_files=[str(f) for f in files], split="train", **extra)
            except OSError:
                raise
            except Exception as exc:
                raise ValueError(f"data: {str(p)!r} cannot be read as {kind} files: {_root_cause(exc)}") from None
            changed = _changed_arrow_cache(ds, cache_dir)
            if changed is None or attempt:
                break
            logger.warning(
                "detsampler: the arrow cache %s differs from what was written (edited or damaged since): parsed "
                "again from the corpus",
                changed,
            )
            del ds
            shutil.rmtree(hf_dir)
    if len(ds) == 0:
        raise ValueError(f"data: {str(p)!r} holds no documents")
    return datasets.Dataset(ds.data, info=ds.info, split=ds.split, indices_table=ds._indices, fingerprint=fingerprint)


def _changed_arrow_cache(ds: datasets.Dataset, cache_dir: str | os.PathLike) -> Path | None:
    """The first arrow file of ``ds``'s cache whose content is not what was recorded when it was first read (None when
    all are): Hugging Face serves its cache as it finds it, so its content hash is recorded beside each file
    (``<file>.detsampler.json``) and checked on every load; the per-file hash cache is keyed by the file's stat with
    its ctime, so an unchanged file hashes nothing and any write, its mtime restored or not, is hashed again."""
    for entry in ds.cache_files:
        arrow = Path(entry["filename"])
        digest = content_fingerprint(arrow, [arrow], "arrow", cache_dir, announce=False).digest
        record = arrow.with_name(arrow.name + ".detsampler.json")
        try:
            recorded = json.loads(record.read_text()).get("content")
        except (OSError, ValueError, AttributeError):
            recorded = None
        if recorded is None:
            try:
                atomic_write(record, json.dumps({"content": digest}) + "\n")
            except OSError:
                pass  # a read-only cache: checked against nothing
        elif recorded != digest:
            return arrow
    return None


def check_text_column(ds: datasets.Dataset, text_column: str) -> None:
    """Raise unless ``ds`` is a map-style dataset with a string column ``text_column``."""
    if not isinstance(ds, datasets.Dataset):
        raise ValueError(f"the corpus must be a map-style datasets.Dataset, got {type(ds).__name__}")
    if text_column not in ds.column_names:
        raise ValueError(
            f"text_column {text_column!r} is not a column of the dataset; its columns are {ds.column_names}: "
            "pass --text-column (text_column=) naming the column that holds the documents"
        )


def default_tokenizer(
    cache_dir: str | os.PathLike,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    corpus: datasets.Dataset | None = None,
    text_column: str = "text",
) -> Tokenizer:
    """A BPE tokenizer trained on ``corpus``'s ``text_column`` (default: the default corpus) the first time, cached
    under ``cache_dir``.

    The cache name holds the corpus fingerprint and the vocabulary size; a file lock keeps concurrent callers from
    training twice.
    """
    corpus = default_corpus() if corpus is None else corpus
    check_text_column(corpus, text_column)
    root = Path(cache_dir) / "tokenizers"
    root.mkdir(parents=True, exist_ok=True)
    name = f"corpus-{corpus._fingerprint}-{text_column}-bpe{vocab_size}.model"
    path = root / name
    with FileLock(str(root / (name + ".lock"))):
        if path.is_file():
            return Tokenizer.load(path)
        logger.info("detsampler: training a %d-piece tokenizer on the corpus into %s", vocab_size, path)
        return train_tokenizer(None, vocab_size, path, texts=corpus[text_column])
