"""Benchmark 7: index build, memory, random access and resume at 10^6-10^7 documents, detsampler against the peers that
build an index (Megatron-LM's GPTDataset and BlendedDataset, OLMo-core's FSL dataset and loader).

Corpus: ``N`` documents of synthetic lengths (log-normal, median 40 tokens, mean about 60, at least 2, EOS included),
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
import time
from pathlib import Path

import numpy as np

from tests.benchmarks import peers
from tests.benchmarks.common import BenchResult, Table, fmt_bytes, fmt_rate, fmt_seconds, ratio_column, run_child

__all__ = ["main", "write_corpus"]

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "bench" / "scale"
SIZES = (1_000_000, 10_000_000)
MIXTURE_SIZES = (1_000_000,)
RANDOM_BATCHES = 20
TIMEOUT_S = 300
CONTENDERS = (
    "detsampler concat",
    "detsampler bestfit",
    "Megatron GPTDataset",
    "OLMo-core NumpyFSLDataset + NumpyFSLDataLoader",
)
MIXTURES = ("detsampler Mixture (3 sources)", "Megatron BlendedDataset (3 sources)")


def synthetic_lengths(n: int, seed: int = 0) -> np.ndarray:
    """Document lengths with their EOS: log-normal, median 40, at least 2 (one token and the EOS)."""
    rng = np.random.default_rng(seed)
    return np.maximum(2, rng.lognormal(np.log(40.0), 0.9, n)).astype(np.int64)


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


def _measure(contender: str, data: Path, step: int) -> tuple[dict | None, dict | None]:
    cold = run_child(
        "tests.benchmarks._scale_child",
        dict(contender=contender, data=str(data), step=0, cold=True, random_batches=0),
        TIMEOUT_S,
    )
    if cold is None:
        return None, None
    warm = run_child(
        "tests.benchmarks._scale_child",
        dict(contender=contender, data=str(data), step=step, cold=False, random_batches=RANDOM_BATCHES),
        TIMEOUT_S,
    )
    return cold, warm


def _table(n: int, step: int, names: tuple[str, ...], results: dict, title: str) -> Table:
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
            rows.append([name, f"did not finish within {TIMEOUT_S} s or failed (see the run's output)"] + ["—"] * 8)
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


def main() -> BenchResult:
    t_start = time.perf_counter()
    source, vocab, eos_id = _source_tokens()
    tables = []
    for n in SIZES:
        data = write_corpus(CACHE / f"n{n}", n, source, vocab, eos_id)
        meta = json.loads((data / "meta.json").read_text())
        step = (meta["num_tokens"] + n) // 2048 // 8 // 2
        names = CONTENDERS + (MIXTURES if n in MIXTURE_SIZES else ())
        results = {c: _measure(c, data, step) for c in names}
        tables.append(_table(n, step, CONTENDERS, results, "One dataset"))
        if n in MIXTURE_SIZES:
            tables.append(_table(n, step, MIXTURES, results, "Mixture of three sources"))
    notes = [
        (
            "10^8 documents are not run by `make bench`: the corpus alone is about 12 GB of tokens at these lengths,"
            " and from 10^6 to 10^7 documents the cold builds of Megatron (document, sample and shuffle indices) and of"
            " detsampler's layouts (a permutation of the documents and a cumulative sum of their lengths; bestfit packs"
            " every window) grew about tenfold: at 10^8 they would take minutes each on 2 cores. OLMo-core's FSL"
            " dataset chunks the token array without looking at documents, so its index is O(samples), not"
            " O(documents). detsampler rebuilds its layout in every process (nothing is cached for concat), which is"
            " its resume cost here; the plan and the permutation are O(1) (benchmark 2)."
        ),
        (
            f"Machine: {os.cpu_count()} cores; each number is one run in a fresh process (no repeats: the cold builds "
            "write "
            "files and take seconds)."
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


if __name__ == "__main__":
    print(main().markdown())
