"""Benchmark 8: building an index with a Hugging Face tokenizer.json, against the tokenizers library's own batch
encoder and against ``datasets.map(batched=True, num_proc=N)`` with the same tokenizer, on the same cores.

Data: the first 1,200 files of the default corpus (the Python standard library's sources); a byte-level BPE
tokenizer.json of 8,000 tokens trained on the first 300 (``train_hf_bpe``). Contenders, interleaved round by round
(best of 5 rounds, the order reversed every other round), each producing every document's ids:
- ``tokenizers`` ``encode_batch_fast`` over the whole corpus in one call (its Rust thread pool on every core; the ids
  read out, nothing written): the ceiling;
- ``detsampler.index.build_index(dataset, tokenizer)`` into a fresh cache directory (num_proc=1: the Rust pool
  parallelizes each batch of 256 texts, the next batch encodes while this one is written): reads the texts from
  Arrow, encodes, writes tokens.npy, lengths, offsets, checksums, meta (every file fsynced), opens the index;
- ``datasets.Dataset.map(batched=True, num_proc=N)`` with the same tokenizer, writing an ``input_ids`` column to a
  fresh cache file, for N = 1 and N = the core count (the usual HF preprocessing step).
Each clock stops when the contender holds its result; deleting what it wrote comes after. "CPU" is the user + system
time of this process and its children over the same span (on a machine shared with other work, wall times vary with
the load, CPU times much less).

Why an earlier run printed 80% and one before it 117% (measured while writing this, 2 shared cores at load 1.6-4.9):
over 300 documents (950k tokens, 0.63 s) the build's fixed work (its two batches' conversion to arrays, nine fsyncs,
checksums, meta, opening the index, and the temporary directory's deletion, then inside the clock) was 0.1 s, about
15% of the run, and one 0.6 s run of a two-core thread pool swings by 2x with the load: the ratio measured the load
as much as the build. With the other processes on the machine, the Rust pool often gets one core: the one-call
encode then ran at 1.0 core (wall = CPU) and the build, which converts and writes while the next batch encodes, at up
to 1.5, so the wall ratio can land anywhere from 80% to 150%. The CPU ratio is the figure that holds: the build
spends the encode's CPU time and little more. The batching stays (over 1,200 documents the build's encode pipeline
alone, batches of 256 with one encoding ahead, ran at 0.98x the one-call encode in the same run; 128 x 2 in flight
0.97x, 64 x 3 0.57x); the corpus grew to 1,200 documents."""

from __future__ import annotations

import logging
import os
import resource
import shutil
import tempfile
import time
import warnings
from pathlib import Path

from tests.benchmarks.common import BenchResult, Table, Verdict, fmt_rate, ratio_column

__all__ = ["main"]

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "bench"
NUM_DOCS = 300  # the tokenizer's training documents
ENCODE_DOCS = 1200  # the documents every contender tokenizes
VOCAB = 8000
ROUNDS = 5
TARGET_ENCODE = 0.9
TARGET_MAP = 1.0


def _setup():
    from detsampler.text.corpus import default_corpus
    from detsampler.text.hf import HFTokenizer, train_hf_bpe

    train = default_corpus(max_documents=NUM_DOCS)
    out = CACHE / f"hf-bpe-{train._fingerprint}-{VOCAB}"
    tok = (
        HFTokenizer.load(out / "tokenizer.json")
        if (out / "tokenizer.json").is_file()
        else train_hf_bpe(train["text"], VOCAB, out)
    )
    return default_corpus(max_documents=ENCODE_DOCS), tok


def _encode_batch(tok, texts: list[str]) -> int:
    """tokenizers' own batch encode of every text in one call (the most its thread pool can be given), ids read out."""
    from tokenizers import Tokenizer

    rust = Tokenizer.from_file(tok.path)
    return sum(len(e.ids) for e in rust.encode_batch_fast(texts, add_special_tokens=False))


BUILD_PHASES: list[float] = []  # the build's own tokenize-phase seconds (meta "build.seconds"), one per call


def _build(corpus, tok, d: str) -> int:
    from detsampler.index import build_index

    index = build_index(corpus, tok, cache_dir=d, progress=False)
    BUILD_PHASES.append(float(index.meta["build"]["seconds"]))
    return index.num_tokens


def _map(corpus, tok, num_proc: int, d: str) -> int:
    ds = corpus.select_columns(["text"]).map(
        lambda b: {"input_ids": tok.encode_batch(b["text"])},
        batched=True,
        batch_size=1024,
        num_proc=None if num_proc == 1 else num_proc,
        remove_columns=["text"],
        load_from_cache_file=False,
        cache_file_name=str(Path(d) / "map.arrow"),
        desc=None,
    )
    return sum(len(x) for x in ds["input_ids"])


def _cpu_seconds() -> float:
    """User + system CPU time of this process and its reaped children."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _timed(fn) -> tuple[int, float, float]:
    """(tokens, wall seconds, CPU seconds) of ``fn(d)`` with a fresh directory ``d``, deleted after the clock stops."""
    d = tempfile.mkdtemp(dir=CACHE)
    try:
        t0, c0 = time.perf_counter(), _cpu_seconds()
        tokens = fn(d)
        return tokens, time.perf_counter() - t0, _cpu_seconds() - c0
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main() -> BenchResult:
    warnings.filterwarnings("ignore")
    logging.getLogger("datasets").setLevel(logging.ERROR)
    import datasets

    datasets.disable_progress_bars()
    t_start = time.perf_counter()
    CACHE.mkdir(parents=True, exist_ok=True)
    corpus, tok = _setup()
    texts = list(corpus["text"])
    cores = os.cpu_count() or 1
    contenders = {
        "tokenizers encode_batch_fast (ids only)": lambda d: _encode_batch(tok, texts),
        "detsampler build_index (tokenizer.json)": lambda d: _build(corpus, tok, d),
        "datasets.map(batched=True, num_proc=1)": lambda d: _map(corpus, tok, 1, d),
        f"datasets.map(batched=True, num_proc={cores})": lambda d: _map(corpus, tok, cores, d),
    }
    best = {name: (float("inf"), 0.0) for name in contenders}
    tokens, loads, phases = {}, [], {}
    for r in range(ROUNDS):  # interleaved: load on the shared machine hits every contender alike
        loads.append(os.getloadavg()[0])
        for name, fn in list(contenders.items())[:: 1 if r % 2 == 0 else -1]:
            tokens[name], wall, cpu = _timed(fn)
            if wall < best[name][0]:
                best[name] = (wall, cpu)
                phases[name] = BUILD_PHASES[-1] if "build_index" in name else None
    assert len(set(tokens.values())) == 1, tokens  # every contender produced the same ids
    rates = {name: tokens[name] / best[name][0] for name in contenders}
    names = list(contenders)
    ratios = ratio_column([rates[n] for n in names], higher_is_better=True)
    cpu_ratios = ratio_column([best[n][1] for n in names], higher_is_better=False)
    rows = [
        [n, f"{best[n][0]:.2f} s", fmt_rate(rates[n], " tokens/s"), r, f"{best[n][1]:.2f} s", c]
        for n, r, c in zip(names, ratios, cpu_ratios)
    ]
    table = Table(
        f"{next(iter(tokens.values())):,} tokens of {len(texts)} documents, vocabulary {tok.vocab_size}, "
        f"{cores} cores; best of {ROUNDS} interleaved rounds",
        ["contender", "time", "tokens/s", "rate / best", "CPU (this round)", "CPU / least"],
        rows,
        [
            f"1-minute load average at the start of each round: {', '.join(f'{x:.1f}' for x in loads)}.",
            "The build's best round: tokenize phase (read, encode, convert, write tokens.npy and fsync it) "
            f"{phases['detsampler build_index (tokenizer.json)']:.2f} s of its "
            f"{best['detsampler build_index (tokenizer.json)'][0]:.2f} s; the rest is offsets, checksums, meta, "
            "fsyncs and opening the index.",
        ],
    )
    build = rates["detsampler build_index (tokenizer.json)"]
    encode = rates["tokenizers encode_batch_fast (ids only)"]
    cpu_build = best["detsampler build_index (tokenizer.json)"][1]
    cpu_encode = best["tokenizers encode_batch_fast (ids only)"][1]
    best_map = max(rates[n] for n in names if n.startswith("datasets.map"))
    verdicts = [
        Verdict(
            "index build with a tokenizer.json at least 90% of tokenizers' own encode_batch",
            build >= TARGET_ENCODE * encode,
            f"{build / encode:.1%} ({fmt_rate(build, ' tokens/s')} vs {fmt_rate(encode, ' tokens/s')}); CPU time of the"
            f" build / of the encode in their best rounds: {cpu_build / cpu_encode:.2f}x.",
        ),
        Verdict(
            "index build at least 1.0x datasets.map(batched=True, num_proc=N), best N",
            build >= TARGET_MAP * best_map,
            f"{build / best_map:.2f}x ({fmt_rate(build, ' tokens/s')} vs {fmt_rate(best_map, ' tokens/s')}).",
        ),
    ]
    return BenchResult(
        8,
        "Index build with a Hugging Face tokenizer.json",
        __doc__.split("\n", 2)[2].strip(),
        [table],
        verdicts,
        [],
        time.perf_counter() - t_start,
    )


if __name__ == "__main__":
    print(main().markdown())
