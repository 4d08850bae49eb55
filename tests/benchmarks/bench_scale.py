"""Benchmark 7: index build, memory, random access and resume at 10^6-10^8 documents, detsampler against the peers that
build an index (Megatron-LM's GPTDataset and BlendedDataset, OLMo-core's FSL dataset and loader).

Corpus: ``N`` documents of synthetic lengths (log-normal, median 40 tokens, mean about 60, at least 2, EOS included;
from ``SHORT_FROM`` = 10^8 documents median 8, mean about 12, so that the corpus stays within ``MAX_EXTRA_BYTES``),
their tokens read in turn from benchmark 3's real token stream (the standard library tokenized with its sentencepiece
model), written once under ``.cache/bench/scale`` by Megatron's own ``IndexedDatasetBuilder`` (``corpus.bin`` /
``corpus.idx``). OLMo-core reads ``corpus.bin`` as its raw token file; detsampler reads it too, through a ``TokenIndex``
over the same offsets (its lengths exclude the EOS, which detsampler keeps virtual). Samples of 2,048 tokens, micro
batches of 8, one rank.

Every (contender, N) runs in a fresh interpreter (``_scale_child``; one torch thread, as in a DataLoader worker), twice:
- **cold**: its index cache removed first; the clock runs from nothing built to the first micro batch at step 0
  (Megatron: ``BlendedMegatronDatasetBuilder.build()`` writes its document, sample and shuffle indices; OLMo-core: the
  dataset's ``prepare()`` and the loader's global indices; detsampler: the layout, which for ``bestfit`` packs every
  window and caches the bin counts). "RSS growth" is the peak resident size reached meanwhile minus the size before;
  "on disk" is what the contender wrote for its index;
- **resume**: a new process with the caches warm, from nothing to the first micro batch at step ``k`` = half an epoch
  (Megatron: build from cache, then its samples ``8k .. 8k+7``, what ``consumed_samples`` selects; OLMo-core: its
  loader's ``load_state_dict`` with ``batches_processed = k``; detsampler: ``DeterministicBatchSampler(start_step=k)``),
  then random micro batches one by one (Megatron ``ds[i]``, OLMo-core ``loader[step]``, detsampler
  ``__getitems__``) for the random-access rate.
The mixture rows blend three sources that are the same documents (weights 0.5, 0.3, 0.2): Megatron's ``BlendedDataset``
builds its dataset and sample indices of ``num_samples`` entries; detsampler's ``Mixture`` builds none.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np

from tests.benchmarks import peers
from tests.benchmarks.common import BenchResult, Table, fmt_bytes, fmt_rate, fmt_seconds, ratio_column, run_child

__all__ = ["main", "write_corpus"]

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "bench" / "scale"
SIZES = (1_000_000, 10_000_000, 100_000_000)
SHORT_FROM = 100_000_000  # from this size on, documents are short (median 8 tokens): the corpus stays under 10 GB
MEDIAN, SHORT_MEDIAN, SIGMA = 40.0, 8.0, 0.9
MAX_EXTRA_BYTES = 10e9  # a size whose files (corpus and every contender's index) would need more is not run
# Bytes on disk per document besides its tokens (2 bytes each): Megatron's .idx (4 + 8 + 8), detsampler's lengths and
# offsets (8 + 8), Megatron's document index (4), detsampler's persisted layouts (about 20, measured at 10^7).
BYTES_PER_DOCUMENT = 60
MIXTURE_SIZES = (1_000_000,)
RANDOM_BATCHES = 20
TIMEOUT_S = 300
TIMEOUT_PER_DOC_S = 3e-6  # children at larger sizes get up to this much per document (at 10^8: 300 s)
CONTENDERS = (
    "detsampler concat",
    "detsampler bestfit",
    "Megatron GPTDataset",
    "OLMo-core NumpyFSLDataset + NumpyFSLDataLoader",
)
MIXTURES = ("detsampler Mixture (3 sources)", "Megatron BlendedDataset (3 sources)")


def _median(n: int) -> float:
    return SHORT_MEDIAN if n >= SHORT_FROM else MEDIAN


def synthetic_lengths(n: int, seed: int = 0, median: float | None = None) -> np.ndarray:
    """Document lengths with their EOS: log-normal (median 40, or 8 from ``SHORT_FROM`` documents), at least 2 (one
    token and the EOS). Drawn in chunks, so the only O(n) array is the result."""
    median = _median(n) if median is None else median
    rng = np.random.default_rng(seed)
    out = np.empty(n, dtype=np.int64)
    for lo in range(0, n, 10_000_000):
        hi = min(n, lo + 10_000_000)
        out[lo:hi] = np.maximum(2, rng.lognormal(np.log(median), SIGMA, hi - lo))
    return out


def estimated_bytes(n: int) -> float:
    """Disk the corpus of ``n`` documents and every contender's index need (the module's constants)."""
    mean_tokens = _median(n) * np.exp(SIGMA**2 / 2)
    return n * (2 * mean_tokens + BYTES_PER_DOCUMENT)


def skip_reason(n: int, free_bytes: int) -> str | None:
    """Why size ``n`` is not run here (None when it is): its files would not fit the budget or the free disk."""
    need = estimated_bytes(n)
    if need > MAX_EXTRA_BYTES:
        return f"its files would need about {fmt_bytes(need)}, over the {fmt_bytes(MAX_EXTRA_BYTES)} budget"
    if need > free_bytes - 5e9:
        return f"its files would need about {fmt_bytes(need)}; {fmt_bytes(free_bytes)} free (5 GB kept free)"
    return None


def write_corpus(directory: Path, n: int, source: np.ndarray, vocab: int, eos_id: int) -> Path:
    """The files of one corpus size (see the module doc); written once, reused when ``meta.json`` is present."""
    if (directory / "meta.json").is_file():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    lengths = synthetic_lengths(n)
    peers.write_megatron_synthetic(directory / "corpus", lengths, source, eos_id)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    np.save(directory / "det_lengths.npy", lengths - 1)
    np.save(directory / "det_offsets.npy", offsets)
    meta = {"num_documents": n, "num_tokens": int(lengths.sum()) - n, "vocab": vocab, "eos_id": eos_id}
    (directory / "meta.json").write_text(json.dumps(meta))
    return directory


def _source_tokens() -> tuple[np.ndarray, int, int]:
    from tests.benchmarks.bench_loader import _setup

    _, tokenizer, stored, _ = _setup()
    return np.asarray(stored.tokens), tokenizer.vocab_size, stored.eos_id


def _measure(contender: str, data: Path, step: int, timeout: float) -> tuple[dict | None, dict | None]:
    cold = run_child(
        "tests.benchmarks._scale_child",
        dict(contender=contender, data=str(data), step=0, cold=True, random_batches=0),
        timeout,
    )
    if cold is None:
        return None, None
    warm = run_child(
        "tests.benchmarks._scale_child",
        dict(contender=contender, data=str(data), step=step, cold=False, random_batches=RANDOM_BATCHES),
        timeout,
    )
    return cold, warm


def _table(n: int, step: int, names: tuple[str, ...], results: dict, title: str, timeout: float) -> Table:
    cold = [results[c][0] for c in names]
    warm = [results[c][1] for c in names]
    build = [r["first_batch_s"] if r else None for r in cold]
    rss = [r["rss_growth"] if r else None for r in cold]
    resume = [r["first_batch_s"] if r else None for r in warm]
    rand = [r["random_tokens_per_s"] if r else None for r in warm]
    cols = [ratio_column(build, False), ratio_column(rss, False), ratio_column(resume, False), ratio_column(rand, True)]
    rows = []
    for i, name in enumerate(names):
        if cold[i] is None:
            rows.append([name, f"did not finish within {timeout:.0f} s or failed (see the run's output)"] + ["—"] * 8)
            continue
        rows.append(
            [
                name,
                fmt_seconds(build[i]),
                cols[0][i],
                fmt_bytes(rss[i]),
                cols[1][i],
                fmt_bytes(cold[i]["cache_bytes"]),
                fmt_seconds(resume[i]),
                cols[2][i],
                fmt_rate(rand[i], " tokens/s"),
                cols[3][i],
            ]
        )
    notes = []
    for label, values, better in (
        ("cold build", build, min),
        ("RSS growth", rss, min),
        ("resume", resume, min),
        ("random access", rand, max),
    ):
        known = [(v, names[i]) for i, v in enumerate(values) if v is not None]
        if known:
            notes.append(f"Strongest on {label}: {better(known)[1]}.")
    for i, name in enumerate(names):
        codes = sorted({r["exit_code"] for r in (cold[i], warm[i]) if r and "exit_code" in r})
        if codes:
            notes.append(
                f"{name}: a measuring process exited {', '.join(map(str, codes))} after printing its result (its"
                " teardown aborted); the numbers are the ones it printed."
            )
    return Table(
        f"{title}: {n:,} documents, resume at step {step:,}",
        [
            "contender",
            "cold: first batch",
            "/ best",
            "RSS growth",
            "/ best",
            "on disk",
            "resume at step k",
            "/ best",
            "random micro batches",
            "/ best",
        ],
        rows,
        [" ".join(notes)],
    )


def _growth_notes(by_size: dict[int, dict]) -> list[str]:
    """Per contender, how its cold build time and RSS grew from each size to the next (measured), and the next
    size's values extrapolated at the last measured growth."""
    sizes = sorted(by_size)
    notes = []
    for name in CONTENDERS:
        cells = []
        for a, b in zip(sizes, sizes[1:]):
            ca, cb = by_size[a].get(name, (None, None))[0], by_size[b].get(name, (None, None))[0]
            if ca and cb:
                cells.append(
                    f"{a:.0e} -> {b:.0e}: cold {fmt_seconds(ca['first_batch_s'])} -> {fmt_seconds(cb['first_batch_s'])}"
                    f" ({cb['first_batch_s'] / ca['first_batch_s']:.1f}x), RSS {fmt_bytes(ca['rss_growth'])} ->"
                    f" {fmt_bytes(cb['rss_growth'])} ({cb['rss_growth'] / max(ca['rss_growth'], 1):.1f}x)"
                )
        if cells:
            notes.append(f"Growth, {name}: " + "; ".join(cells) + ".")
    return notes


def _extrapolation(n: int, by_size: dict[int, dict]) -> str:
    """The cold build time and RSS of each contender at ``n``, extrapolated from the two largest measured sizes."""
    sizes = sorted(by_size)
    if len(sizes) < 2:
        return ""
    a, b = sizes[-2], sizes[-1]
    cells = []
    for name in CONTENDERS:
        ca, cb = by_size[a].get(name, (None, None))[0], by_size[b].get(name, (None, None))[0]
        if ca and cb:
            f_t, f_m = cb["first_batch_s"] / ca["first_batch_s"], cb["rss_growth"] / max(ca["rss_growth"], 1)
            k = np.log(n / b) / np.log(b / a)  # growth per size step, applied for the steps from b to n
            cells.append(
                f"{name} ~{fmt_seconds(cb['first_batch_s'] * f_t**k)}, ~{fmt_bytes(cb['rss_growth'] * f_m**k)}"
            )
    return f" Extrapolated cold build and RSS at {n:.0e} from {a:.0e} -> {b:.0e}: " + "; ".join(cells) + "."


def main() -> BenchResult:
    t_start = time.perf_counter()
    source, vocab, eos_id = _source_tokens()
    tables, notes, by_size = [], [], {}
    CACHE.mkdir(parents=True, exist_ok=True)
    for n in SIZES:
        reason = skip_reason(n, shutil.disk_usage(CACHE).free)
        if reason:
            notes.append(f"{n:.0e} documents not run: {reason}." + _extrapolation(n, by_size))
            continue
        t0 = time.perf_counter()
        data = write_corpus(CACHE / f"n{n}", n, source, vocab, eos_id)
        meta = json.loads((data / "meta.json").read_text())
        timeout = max(TIMEOUT_S, TIMEOUT_PER_DOC_S * n)
        step = (meta["num_tokens"] + n) // 2048 // 8 // 2
        names = CONTENDERS + (MIXTURES if n in MIXTURE_SIZES else ())
        results = {c: _measure(c, data, step, timeout) for c in names}
        by_size[n] = results
        title = f"One dataset (median document {_median(n):.0f} tokens)"
        tables.append(_table(n, step, CONTENDERS, results, title, timeout))
        if n in MIXTURE_SIZES:
            tables.append(_table(n, step, MIXTURES, results, "Mixture of three sources", timeout))
        notes.append(
            f"{n:.0e} documents: {meta['num_tokens'] + n:,} tokens with the EOS, {fmt_bytes(_du(data))} on disk with"
            f" every contender's index; corpus, runs and all {fmt_seconds(time.perf_counter() - t0)}."
        )
    notes += _growth_notes(by_size)
    notes += [
        (
            "OLMo-core's FSL dataset chunks the token array without looking at documents, so its index is O(samples),"
            " not O(documents). detsampler builds its layout in every process here (this benchmark opens a TokenIndex"
            " over Megatron's files, without persisted layouts; benchmark 11 measures those), which is its resume cost;"
            " the plan and the permutation are O(1) (benchmark 2)."
        ),
        (
            f"Machine: {os.cpu_count()} cores; each number is one run in a fresh process (no repeats: the cold builds"
            " write files and take seconds)."
        ),
    ]
    return BenchResult(
        7,
        "Index build, memory, random access and resume at scale (peers with an index)",
        __doc__.split("\n", 2)[2].strip(),
        tables,
        [],
        notes,
        time.perf_counter() - t_start,
    )


def _du(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


if __name__ == "__main__":
    print(main().markdown())
