"""Benchmark 18: opening an SFT index of 10^7 examples, and its first micro batch, in a fresh process.

Data: ``N`` prompt/completion examples (default 10^7; 6 words of prompt, 6 of completion, drawn with a seeded
generator from the words of the SFT tests' vocabulary) saved once as a Hugging Face dataset under
``.cache/bench/sft_open``, and their chat index built once by ``build_index(chat=ChatConfig(policy="completion"))``
(tokens and ``loss_mask.npy`` stored, a 400-piece BPE tokenizer trained on those words), with its concat layout of
256-token samples persisted; the same at 10^5 examples beside it. Then, per size, a fresh interpreter
(``_sft_open_child``) imports detsampler, opens the index (``TokenIndex.open``: the meta, the small checksum files, the
arrays memory-mapped) and reads the plan's first micro batch of 8 samples (the persisted layout opened, ``get_batch``
with its ``loss_mask``); seconds and resident-set growth (VmRSS; the peak from VmHWM), split into the process's own
memory (RssAnon) and the page cache's pages mapped into it (RssFile: the memory-mapped files' pages it touched, a
whole cached folio at a time, shared by every process of the node and reclaimable: they are the page cache, not the
process's). The files are in the page cache (just written or read), as on a node that has read them before.
Target (issue #23): a 10^7-example SFT index opens in < 100 ms and < 100 MB per process (judged on the open's RSS and
the process's own memory through the first micro batch).

Usage: ``python -m tests.benchmarks.bench_sft_open [--examples N]``."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from tests.benchmarks.common import BenchResult, Table, Verdict, fmt_bytes, run_child

__all__ = ["main"]

ROOT = Path(__file__).resolve().parents[2]
DIR = ROOT / ".cache" / "bench" / "sft_open"
SEQ_LEN, MICRO_BATCH = 256, 8
TARGET_S, TARGET_RSS = 0.1, 100 << 20


def _dataset(num: int, words: list[str]):
    """The ``num`` examples, saved once (a saved dataset keeps its fingerprint: the index cache finds it again)."""
    import datasets

    path = DIR / f"data-{num}"
    if not path.exists():
        drawn = np.asarray(words)[np.random.default_rng(num).integers(0, len(words), size=(num, 12))]
        columns = {"prompt": [" ".join(r[:6]) + "\n" for r in drawn], "completion": [" ".join(r[6:]) for r in drawn]}
        datasets.Dataset.from_dict(columns).save_to_disk(str(path))
    return datasets.load_from_disk(str(path))


def _index(num: int, tokenizer, words: list[str]):
    from detsampler import LayoutConfig
    from detsampler.index import build_index
    from detsampler.text.chat import ChatConfig

    chat = ChatConfig(policy="completion", column="prompt", completion_column="completion")
    t0 = time.perf_counter()
    index = build_index(_dataset(num, words), tokenizer, cache_dir=DIR / "cache", chat=chat, num_proc=2)
    index.layout(LayoutConfig(kind="concat", seq_len=SEQ_LEN))
    return index, time.perf_counter() - t0


def main(examples: int = 10**7) -> BenchResult:
    from tests.chat_data import _words, make_chat_tokenizer

    t_start = time.perf_counter()
    DIR.mkdir(parents=True, exist_ok=True)
    words = _words()
    tokenizer = make_chat_tokenizer(DIR / "tokenizer")
    rows, verdicts = [], []
    for num in sorted({10**5, examples}):
        index, prepare_s = _index(num, tokenizer, words)
        args = {"path": str(index.path), "seq_len": SEQ_LEN, "micro_batch_size": MICRO_BATCH}
        run_child("tests.benchmarks._sft_open_child", args, timeout=300)  # the page cache warm, as after a first read
        r = run_child("tests.benchmarks._sft_open_child", args, timeout=300)
        files = sum(p.stat().st_size for p in index.path.iterdir() if p.is_file())
        if r is None:
            rows.append([f"{num:,}", "failed", "", "", "", "", "", ""])
            continue
        rows.append(
            [
                f"{r['num_documents']:,}",
                f"{r['num_tokens']:,} ({fmt_bytes(files)})",
                f"{r['open_seconds'] * 1e3:.1f} ms",
                fmt_bytes(r["open_rss_growth"]),
                f"{r['first_batch_seconds'] * 1e3:.1f} ms",
                f"{fmt_bytes(r['rss_growth'])} / {fmt_bytes(r['peak_growth'])}",
                f"{fmt_bytes(r['anon_growth'])} / {fmt_bytes(r['file_growth'])}",
                f"{r['trained_in_batch']:,} of {r['tokens_in_batch']:,}",
            ]
        )
        if num == examples:
            verdicts.append(
                Verdict(
                    f"an SFT index of {num:,} examples opens in < 100 ms and < 100 MB per process",
                    r["open_seconds"] < TARGET_S
                    and r["open_rss_growth"] < TARGET_RSS
                    and r["anon_growth"] < TARGET_RSS
                    and r["mask_is_memmap"],
                    f"open {r['open_seconds'] * 1e3:.1f} ms (RSS +{fmt_bytes(r['open_rss_growth'])}); with the first"
                    f" micro batch {(r['open_seconds'] + r['first_batch_seconds']) * 1e3:.1f} ms and the process's own"
                    f" memory +{fmt_bytes(r['anon_growth'])} (RSS +{fmt_bytes(r['rss_growth'])}, of which"
                    f" +{fmt_bytes(r['file_growth'])} the page cache's pages of the memory-mapped files, shared and"
                    f" reclaimable); the mask memory-mapped: {r['mask_is_memmap']}.",
                )
            )
        print(f"[sft_open] {num:,} examples: built or found in {prepare_s:.1f} s; {r}", flush=True)
    table = Table(
        "An SFT index (prompt/completion, completion-only loss) opened in a fresh process, then its first micro batch",
        [
            "examples",
            "tokens (files)",
            "open",
            "RSS after open",
            "first micro batch",
            "RSS growth / peak",
            "own / page cache mapped",
            "trained",
        ],
        rows,
    )
    return BenchResult(
        18,
        "Opening an SFT index of 10^7 examples",
        __doc__.split("\n", 2)[2].strip(),
        [table],
        verdicts,
        [],
        time.perf_counter() - t_start,
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--examples", type=int, default=10**7)
    print(main(parser.parse_args().examples).markdown())
