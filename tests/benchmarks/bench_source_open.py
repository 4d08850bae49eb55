"""Benchmark 10: opening a 1 GB pre-tokenized file as an index: seconds and resident-memory growth, in a fresh process.

Files (written once under ``.cache/bench/sources``, 1 GiB of tokens each, documents of 1 to 2,000 tokens, ~1,000 on
average): a Megatron ``.bin`` of uint16 tokens with its ``.idx`` written by megatron-core's own ``_IndexWriter`` (by
hand from the published format when megatron-core is absent); an OLMo-core ``.npy`` of uint32 tokens with EOS after
each document, opened twice: with the ``.csv.gz`` metadata written by OLMo-core's ``write_document_indices``, and
without it (documents found by scanning for EOS). Each open runs in a fresh interpreter (``_open_child``): time of
``open_source(...)`` and the growth of its resident set (VmRSS after minus before; the peak from VmHWM); each file is
opened first with an empty ``DETSAMPLER_CACHE`` (the metadata parsed, and the token file scanned once for its id
bounds per 64 KiB chunk, and its EOS where there is no metadata) and then again (the scan read back from the cache).
The files are in the page cache (just written or read): a cold first open adds the disk's time to read the whole token
file and the per-document index (16 bytes a document)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from tests.benchmarks.common import BenchResult, Table, Verdict, fmt_bytes, run_child

__all__ = ["main"]

ROOT = Path(__file__).resolve().parents[2]
DIR = ROOT / ".cache" / "bench" / "sources"
BYTES = 1 << 30
EOS = 0
TARGET_S = 1.0
TARGET_RSS = 50 << 20


def _doc_lengths(num_tokens: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 2001, size=num_tokens // 1000 + 16)
    cut = int(np.searchsorted(np.cumsum(lengths), num_tokens))
    lengths = lengths[: cut + 1].copy()
    lengths[-1] = num_tokens - int(lengths[:-1].sum())
    return lengths


def _write_tokens(path: Path, dtype: np.dtype, lengths: np.ndarray) -> None:
    """Random ids in [1, 30000) with EOS (0) as each document's last token, written in 64 MiB chunks."""
    rng = np.random.default_rng(1)
    ends = np.cumsum(lengths) - 1
    chunk = (64 << 20) // dtype.itemsize
    total = int(lengths.sum())
    with open(path, "wb") as f:
        for start in range(0, total, chunk):
            block = rng.integers(1, 30000, size=min(chunk, total - start)).astype(dtype)
            e = ends[(ends >= start) & (ends < start + block.size)] - start
            block[e] = EOS
            f.write(block.tobytes())


def _megatron(lengths: np.ndarray) -> Path:
    prefix = DIR / "megatron_text_document"
    if not Path(str(prefix) + ".idx").is_file():
        _write_tokens(Path(str(prefix) + ".bin"), np.dtype(np.uint16), lengths)
        docs = np.arange(lengths.size + 1, dtype=np.int64)
        try:
            from megatron.core.datasets.indexed_dataset import _IndexWriter

            with _IndexWriter(str(prefix) + ".idx", np.uint16) as writer:
                writer.write(lengths.astype(np.int32), None, docs)
        except ImportError:  # the published format (megatron/core/datasets/indexed_dataset.py, _IndexWriter)
            import struct

            with open(str(prefix) + ".idx", "wb") as f:
                f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", 8))
                f.write(struct.pack("<Q", lengths.size) + struct.pack("<Q", docs.size))
                pointers = np.concatenate([[0], np.cumsum(lengths[:-1]) * 2]).astype(np.int64)
                f.write(lengths.astype(np.int32).tobytes() + pointers.tobytes() + docs.tobytes())
    return prefix


def _olmo(lengths: np.ndarray) -> Path:
    path = DIR / "olmo-part-00000.npy"
    if not path.with_suffix(".csv.gz").is_file():
        _write_tokens(path, np.dtype(np.uint32), lengths)
        from olmo_core.data.utils import write_document_indices

        write_document_indices(path, dtype=np.uint32, eos_token_id=EOS)
    return path


def main() -> BenchResult:
    t_start = time.perf_counter()
    DIR.mkdir(parents=True, exist_ok=True)
    prefix = _megatron(_doc_lengths(BYTES // 2, 0))
    olmo = _olmo(_doc_lengths(BYTES // 4, 1))
    scan_dir = DIR / "olmo-nometa"
    scan_dir.mkdir(exist_ok=True)
    scan = scan_dir / olmo.name
    if not scan.exists():
        os.link(olmo, scan)  # the same tokens without the metadata beside them
    cases = {
        "megatron .bin/.idx (uint16)": {"kind": "megatron", "path": str(prefix)},
        "olmo .npy + .csv.gz metadata (uint32)": {"kind": "olmo", "path": str(olmo)},
        "olmo .npy, EOS scan (uint32, no metadata)": {"kind": "olmo", "path": str(scan), "options": {"eos_id": EOS}},
    }
    cache = tempfile.mkdtemp(prefix="open-cache-", dir=DIR)
    try:
        for case in cases.values():  # warm the page cache as a just-written file is (results kept nowhere)
            run_child("tests.benchmarks._open_child", {**case, "cache_dir": tempfile.mkdtemp(dir=cache)}, timeout=300)
        results = {}
        for name, case in cases.items():  # a first open (nothing cached), then a reopen (the boundaries cached)
            fresh = {**case, "cache_dir": tempfile.mkdtemp(dir=cache)}
            results[f"{name}, first open"] = (case, run_child("tests.benchmarks._open_child", fresh, timeout=300))
            results[f"{name}, reopen"] = (case, run_child("tests.benchmarks._open_child", fresh, timeout=300))
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    rows, verdicts = [], []
    for name, (case, r) in results.items():
        if r is None:
            rows.append([name, "failed", "", "", "", ""])
            continue
        token_file = Path(case["path"] + (".bin" if case["kind"] == "megatron" else ""))
        rows.append(
            [
                name,
                fmt_bytes(token_file.stat().st_size),
                f"{r['num_documents']:,}",
                f"{r['seconds']:.3f} s",
                fmt_bytes(r["rss_growth"]),
                fmt_bytes(r["peak_growth"]),
            ]
        )
        verdicts.append(
            Verdict(
                f"{name}: open < 1 s, RSS growth < 50 MB, tokens not copied",
                r["seconds"] < TARGET_S and r["peak_growth"] < TARGET_RSS and r["tokens_is_memmap"],
                f"{r['seconds']:.3f} s, RSS +{fmt_bytes(r['rss_growth'])} (peak +{fmt_bytes(r['peak_growth'])}), "
                f"tokens a memory map: {r['tokens_is_memmap']}.",
            )
        )
    table = Table(
        "Opening 1 GiB of pre-tokenized tokens (fresh process, warm page cache)",
        ["file", "token file", "documents", "open", "RSS growth", "peak RSS growth"],
        rows,
    )
    return BenchResult(
        10,
        "Opening pre-tokenized corpora",
        __doc__.split("\n", 2)[2].strip(),
        [table],
        verdicts,
        [],
        time.perf_counter() - t_start,
    )


if __name__ == "__main__":
    print(main().markdown())
