"""Which loader reads a corpus file, by its name: the one place that knows the corpus file kinds (what the corpus loader
and the tokenizer trainer both read)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["COMPRESSIONS", "EXTENSIONS", "corpus_kind"]

EXTENSIONS = {".txt": "text", ".text": "text", ".md": "text", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}
COMPRESSIONS = (".gz", ".bz2", ".xz")  # what Hugging Face's loaders decompress by themselves (standard library codecs)


def corpus_kind(path: Path) -> str | None:
    """The loader kind of a corpus file by its name (``text``, ``json`` or ``parquet``), whatever the case of its
    suffix and under one compression suffix of :data:`COMPRESSIONS`; None for any other file."""
    name = path.name.lower()
    for compression in COMPRESSIONS:
        if name.endswith(compression):
            name = name[: -len(compression)]
            break
    kind = EXTENSIONS.get(Path(name).suffix)
    return None if kind == "parquet" and name != path.name.lower() else kind  # a compressed parquet file: unreadable
