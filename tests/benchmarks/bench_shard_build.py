"""Benchmark 12: building a sharded index of N shards with 1 process and with W = 2 (issue 12's target: a speed-up of
at least 0.8 W = 1.6x over one process).

The corpus is real text on disk: the interpreter's standard library sources, written as N jsonl files (one document a
source file; the files balanced by bytes, largest document first into the lightest file), tokenized with a BPE
tokenizer trained locally on them. Every contender is the command a user runs, in fresh processes, each into a fresh
cache, timed from the first process's start to the manifest written (so process start-up, imports, the corpus parse and
hash, tokenization, the index writes and the manifest all count):

- ``1 process``: ``detsampler build --sharded`` (builds the N shards one after the other, then the manifest);
- ``2 processes (Slurm array)``: ``detsampler build --shard 0 --num-shards 2`` and ``--shard 1`` started at once (as two
  array tasks would be); the last to finish writes the manifest;
- ``1 process, num_proc 2``: ``detsampler build --sharded --num-proc 2`` (a local pool of 2 processes, each building
  whole shards).

After each run the manifest is checked to exist and to list the N shards. A ``detsampler build --finalize`` after the
array (what a dependent job would run to check the index and print it) is timed on its own, as a note.

The contenders run in turn, ``REPEATS`` rounds, in a rotating order; each is reported by its median. The speed-up is the
1-process median over the other's. The machine's load average is printed with every round: on a shared machine the
ratio is low by however much of the second core another program took.

Run alone: ``python -m tests.benchmarks.bench_shard_build [--shards N] [--documents D] [--repeats R]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.benchmarks.common import BenchResult, Table, Verdict, fmt_bytes, ratio_column

__all__ = ["CONTENDERS", "main", "measure", "write_corpus"]

NUM_SHARDS = 8
REPEATS = 3
VOCAB_SIZE = 8000
TARGET = 1.6  # 0.8 * W with W = 2
WORK = Path(os.environ.get("DETSAMPLER_BENCH_DIR", Path(tempfile.gettempdir()) / "detsampler-bench")) / "shard-build"


def write_corpus(out: Path, num_shards: int, max_documents: int | None = None) -> list[int]:
    """The standard library's sources as ``num_shards`` jsonl files under ``out``, balanced by bytes; returns each
    file's size in bytes."""
    from detsampler.text.corpus import default_corpus

    texts = default_corpus(max_documents=max_documents)["text"]
    shards: list[list[str]] = [[] for _ in range(num_shards)]
    sizes = [0] * num_shards
    for text in sorted(texts, key=len, reverse=True):  # largest first, into the lightest file
        j = sizes.index(min(sizes))
        shards[j].append(text)
        sizes[j] += len(text)
    out.mkdir(parents=True, exist_ok=True)
    for j, docs in enumerate(shards):
        (out / f"part-{j:03d}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
    return [(out / f"part-{j:03d}.jsonl").stat().st_size for j in range(num_shards)]


def _cli(data: Path, tokenizer: Path, cache: Path, *extra: str) -> list[str]:
    base = ["build", "--data", str(data), "--tokenizer", str(tokenizer), "--cache-dir", str(cache)]
    return [sys.executable, "-m", "detsampler.cli", *base, *extra]


def _run_all(commands: list[list[str]]) -> None:
    """Start ``commands`` at once and wait for all; raise with the stderr of one that failed."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    procs = [
        subprocess.Popen(c, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for c in commands
    ]
    errors = [(p.communicate()[1], p.returncode) for p in procs]
    for err, rc in errors:
        if rc != 0:
            raise RuntimeError(f"a build exited {rc}: {err[-2000:]}")


def _one_process(data: Path, tok: Path, cache: Path) -> list[list[list[str]]]:
    return [[_cli(data, tok, cache, "--sharded")]]


def _two_tasks(data: Path, tok: Path, cache: Path) -> list[list[list[str]]]:
    return [[_cli(data, tok, cache, "--shard", str(i), "--num-shards", "2") for i in range(2)]]


def _local_pool(data: Path, tok: Path, cache: Path) -> list[list[list[str]]]:
    return [[_cli(data, tok, cache, "--sharded", "--num-proc", "2")]]


# name -> (processes, the phases of commands: the commands of a phase run at once, the phases one after the other)
CONTENDERS = {
    "1 process (--sharded)": (1, _one_process),
    "2 processes (--shard I --num-shards 2, as a Slurm array)": (2, _two_tasks),
    "1 process, num_proc 2 (--sharded --num-proc 2)": (2, _local_pool),
}


def _check_manifest(cache: Path, num_shards: int) -> None:
    from detsampler.index.sharded import ShardedIndex

    (root,) = cache.glob("sharded-*")
    if len(ShardedIndex.open(root).shards) != num_shards:
        raise RuntimeError(f"{root}: the manifest does not list the {num_shards} shards")


def measure(
    data: Path, tokenizer: Path, work: Path, repeats: int, num_shards: int
) -> tuple[dict[str, list[float]], list[float]]:
    """Wall seconds of each contender per round (a fresh cache each time, rounds in a rotating order), and of a
    ``--finalize`` after each array of tasks."""
    times: dict[str, list[float]] = {name: [] for name in CONTENDERS}
    finalize: list[float] = []
    names = list(CONTENDERS)
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            cache = Path(tempfile.mkdtemp(prefix="cache-", dir=work))
            t0 = time.perf_counter()
            for phase in CONTENDERS[name][1](data, tokenizer, cache):
                _run_all(phase)
            times[name].append(time.perf_counter() - t0)
            _check_manifest(cache, num_shards)
            if CONTENDERS[name][1] is _two_tasks:
                t0 = time.perf_counter()
                _run_all([_cli(data, tokenizer, cache, "--finalize")])
                finalize.append(time.perf_counter() - t0)
            shutil.rmtree(cache, ignore_errors=True)
        last = {name: round(t[-1], 2) for name, t in times.items()}
        print(f"round {r}: {last}, load {os.getloadavg()}", file=sys.stderr)
    return times, finalize


def _train_tokenizer(data: Path, work: Path, vocab_size: int) -> Path:
    from detsampler.text.corpus import load_corpus
    from detsampler.text.tokenizer import train_tokenizer

    path = work / f"tokenizer-{vocab_size}.model"
    train_tokenizer(None, vocab_size, path, texts=load_corpus(str(data), cache_dir=work / "parse")["text"])
    return path


def run(
    num_shards: int, max_documents: int | None, repeats: int, work: Path = WORK, vocab_size: int = VOCAB_SIZE
) -> BenchResult:
    """The benchmark on ``num_shards`` files of the first ``max_documents`` standard-library sources, tokenized with a
    ``vocab_size``-piece BPE model trained on them."""
    t_start = time.perf_counter()
    shutil.rmtree(work, ignore_errors=True)
    data = work / "data"
    sizes = write_corpus(data, num_shards, max_documents)
    tokenizer = _train_tokenizer(data, work, vocab_size)
    load_before = os.getloadavg()
    times, finalize = measure(data, tokenizer, work, repeats, num_shards)
    load_after = os.getloadavg()
    medians = {name: statistics.median(t) for name, t in times.items()}
    one = medians["1 process (--sharded)"]
    rows = []
    for (name, t), ratio in zip(medians.items(), ratio_column(list(medians.values()), higher_is_better=False)):
        rows.append(
            [
                name,
                str(CONTENDERS[name][0]),
                f"{t:.2f} s",
                f"{one / t:.2f}x",
                ratio,
                str([round(x, 2) for x in times[name]]),
            ]
        )
    best_two = max(one / medians[n] for n in medians if CONTENDERS[n][0] == 2)
    loads = f"load average (1, 5, 15 min) {load_before[0]:.2f}/{load_before[1]:.2f}/{load_before[2]:.2f} before, "
    loads += f"{load_after[0]:.2f}/{load_after[1]:.2f}/{load_after[2]:.2f} after, on {os.cpu_count()} cores"
    table = Table(
        f"{num_shards} shards, {fmt_bytes(sum(sizes))} of text ({fmt_bytes(min(sizes))} to {fmt_bytes(max(sizes))} a "
        f"shard), {repeats} rounds",
        ["contender", "processes", "wall time (median)", "speed-up over 1 process", "vs best", "every round"],
        rows,
        [
            loads,
            f"a `--finalize` after the array (not in the times above: the last task writes the manifest) took "
            f"{statistics.median(finalize):.2f} s (median; process start-up and imports included)",
        ],
    )
    verdict = Verdict(
        "building N shards with W processes: >= 0.8 W speed-up over one process (W = 2: 1.6x)",
        best_two >= TARGET,
        f"Measured {best_two:.2f}x ({loads})."
        + ("" if best_two >= TARGET else f" Gap: {TARGET / best_two:.2f}x; a busy machine lowers the ratio."),
    )
    return BenchResult(
        12,
        "Sharded index build: 1 process and 2",
        __doc__.split("\n\n", 1)[1],
        [table],
        [verdict],
        seconds=time.perf_counter() - t_start,
    )


def main(argv: list[str] | None = None) -> BenchResult:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=NUM_SHARDS)
    parser.add_argument("--documents", type=int, default=None, help="the first D standard-library sources (all)")
    parser.add_argument("--repeats", type=int, default=REPEATS)
    args = parser.parse_args(argv)
    result = run(args.shards, args.documents, args.repeats)
    print(result.markdown())
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
