"""Benchmark 16: SFT packing efficiency against TRL's best-fit decreasing and Axolotl's multipack, on the same examples.

Data: the paragraphs (text between blank lines) of the first 1,200 files of the default corpus, each an example,
tokenized by the sentencepiece tokenizer of benchmark 3 (8,000 pieces), each followed by its EOS: many short examples
and a long tail (a few longer than ``seq_len``). Efficiency is the tokens served over the slots of the bins
(``num_bins * seq_len``): padding lowers it. Contenders, at ``seq_len`` 1,024 and 2,048:
- detsampler's ``bestfit`` layout (best-fit decreasing per window of ``window_docs`` examples: the default 1,024,
  16,384, and one window of every example), with ``overlong="truncate"`` and with ``overlong="split"``;
- TRL's ``pack_dataset`` (``trl.data_utils``, best-fit decreasing per ``datasets.map`` batch of 1,000 examples):
  ``strategy="bfd"`` (truncates an over-long example) and ``"bfd_split"`` (splits it), given the same token ids;
- Axolotl's ``MultipackBatchSampler`` (``axolotl.utils.samplers.multipack``, first-fit over the sampler's order, in
  groups of 100,000) over a ``RandomSampler`` (seed 0), given the examples' lengths cut at ``seq_len`` (it cannot
  place a longer one: Axolotl drops those before packing); its own ``efficiency()``.

Each packing's seconds are shown too (one run, the whole dataset; ours builds the layout in RAM, ``make_layout``: its
windows are packed in lockstep, one numpy step per example of the largest window, so one window of every example takes
seconds where 1,024-example windows take a tenth of one)."""

from __future__ import annotations

import logging
import time
import warnings

import numpy as np

from detsampler import LayoutConfig
from detsampler.layout import make_layout
from tests.benchmarks.bench_loader import CACHE, VOCAB
from tests.benchmarks.common import BenchResult, Table, Verdict

__all__ = ["main"]

NUM_FILES = 1200
SEQ_LENS = (1024, 2048)


def _paragraphs(batch: dict) -> dict:
    return {"text": [p for text in batch["text"] for p in text.split("\n\n") if p.strip()]}


def _setup():
    from detsampler.index import build_index
    from detsampler.text.corpus import default_corpus, default_tokenizer

    tokenizer = default_tokenizer(CACHE, vocab_size=VOCAB, corpus=default_corpus(max_documents=600))
    files = default_corpus(max_documents=NUM_FILES)
    corpus = files.map(_paragraphs, batched=True, remove_columns=files.column_names, desc=None)
    return build_index(corpus, tokenizer, cache_dir=CACHE, progress=False)


def _ours(lengths: np.ndarray, seq_len: int, overlong: str, window: int) -> tuple[float, float, int]:
    t0 = time.perf_counter()
    layout = make_layout(LayoutConfig(kind="bestfit", seq_len=seq_len, window_docs=window, overlong=overlong), lengths)
    seconds = time.perf_counter() - t0
    return layout.tokens_per_epoch / (layout.num_samples * seq_len), seconds, layout.num_samples


def _trl(examples, seq_len: int, strategy: str) -> tuple[float, float, int]:
    from trl.data_utils import pack_dataset

    t0 = time.perf_counter()
    packed = pack_dataset(examples, seq_length=seq_len, strategy=strategy)
    seconds = time.perf_counter() - t0
    tokens = int(sum(sum(s) for s in packed["seq_lengths"]))
    return tokens / (len(packed) * seq_len), seconds, len(packed)


def _axolotl(lengths: np.ndarray, seq_len: int) -> tuple[float, float, int] | str:
    try:
        import torch
        from axolotl.utils.samplers.multipack import MultipackBatchSampler
    except ImportError as exc:  # not in the bench extra's pins when its numba does not install
        return f"not installed ({exc.name})"
    extents = np.minimum(lengths.astype(np.int64) + 1, seq_len)
    sampler = torch.utils.data.RandomSampler(range(len(extents)), generator=torch.Generator().manual_seed(0))
    t0 = time.perf_counter()
    multipack = MultipackBatchSampler(
        sampler,
        batch_size=1,
        batch_max_len=seq_len,
        lengths=extents,
        bin_size=seq_len,
        num_processes=1,
        drop_last=False,
    )
    bins = sum(len(b) for b in multipack.generate_batches(set_stats=True))
    return multipack.efficiency(), time.perf_counter() - t0, bins


def main() -> BenchResult:
    import datasets

    warnings.filterwarnings("ignore")
    logging.getLogger("datasets").setLevel(logging.ERROR)
    datasets.disable_progress_bars()
    t_start = time.perf_counter()
    index = _setup()
    lengths = np.asarray(index.lengths)
    tokens, offsets = np.asarray(index.tokens), np.asarray(index.offsets)
    examples = datasets.Dataset.from_dict(
        {"input_ids": [[*tokens[a:b].tolist(), index.eos_id] for a, b in zip(offsets[:-1], offsets[1:])]}
    )
    rows, verdicts, notes = [], [], []
    for seq_len in SEQ_LENS:
        over = int((lengths + 1 > seq_len).sum())
        got = {
            "detsampler bestfit, truncate, window 1,024": _ours(lengths, seq_len, "truncate", 1024),
            "detsampler bestfit, truncate, window 16,384": _ours(lengths, seq_len, "truncate", 16384),
            "detsampler bestfit, truncate, one window": _ours(lengths, seq_len, "truncate", len(lengths)),
            "TRL pack_dataset bfd (truncates)": _trl(examples, seq_len, "bfd"),
            "Axolotl multipack (lengths cut at seq_len)": _axolotl(lengths, seq_len),
            "detsampler bestfit, split, window 1,024": _ours(lengths, seq_len, "split", 1024),
            "detsampler bestfit, split, one window": _ours(lengths, seq_len, "split", len(lengths)),
            "TRL pack_dataset bfd_split": _trl(examples, seq_len, "bfd_split"),
        }
        for name, value in got.items():
            if isinstance(value, str):
                rows.append([str(seq_len), name, value, "—", "—", "—"])
                continue
            eff, seconds, bins = value
            base = got["TRL pack_dataset bfd (truncates)" if "split" not in name else "TRL pack_dataset bfd_split"][0]
            rows.append([str(seq_len), name, f"{100 * eff:.3f}%", f"{eff / base:.4f}x", f"{bins:,}", f"{seconds:.2f}"])
        eff = {name: value[0] for name, value in got.items() if not isinstance(value, str)}
        trl_t, trl_s = eff["TRL pack_dataset bfd (truncates)"], eff["TRL pack_dataset bfd_split"]
        ours_t, ours_s = (
            eff["detsampler bestfit, truncate, window 1,024"],
            eff["detsampler bestfit, split, window 1,024"],
        )
        verdicts.append(
            Verdict(
                f"seq_len {seq_len}: packing efficiency at least TRL's best-fit decreasing on the same examples (our"
                " default window of 1,024 examples, TRL's map batch of 1,000)",
                ours_t >= trl_t and ours_s >= trl_s,
                f"{ours_t / trl_t:.4f}x TRL bfd (truncate: {100 * ours_t:.3f}% vs {100 * trl_t:.3f}%), "
                f"{ours_s / trl_s:.4f}x TRL bfd_split (split: {100 * ours_s:.3f}% vs {100 * trl_s:.3f}%).",
            )
        )
        axolotl = got["Axolotl multipack (lengths cut at seq_len)"]
        if isinstance(axolotl, str):
            verdicts.append(Verdict(f"seq_len {seq_len}: at least Axolotl's multipack", False, f"Axolotl {axolotl}."))
        else:
            one = eff["detsampler bestfit, truncate, one window"]
            verdicts.append(
                Verdict(
                    f"seq_len {seq_len}: packing efficiency at least Axolotl's multipack on the same examples, packed"
                    " in one group (Axolotl's group of 100,000 examples holds them all; our window_docs set to all)",
                    one >= axolotl[0],
                    f"{one / axolotl[0]:.4f}x ({100 * one:.3f}% vs {100 * axolotl[0]:.3f}%). With the default window"
                    f" of 1,024 examples: {ours_t / axolotl[0]:.4f}x (windows of 1,024 leave a partly filled bin"
                    " each; window_docs=16,384: "
                    f"{eff['detsampler bestfit, truncate, window 16,384'] / axolotl[0]:.4f}x).",
                )
            )
        notes.append(f"seq_len {seq_len}: {over:,} of {len(lengths):,} examples are longer than seq_len (EOS counted).")
    table = Table(
        f"Packing efficiency (tokens / bin slots) of {len(lengths):,} examples, {int(lengths.sum()):,} tokens, median "
        f"{int(np.median(lengths))}, longest {int(lengths.max())}",
        ["seq_len", "packing", "efficiency", "/ TRL (same policy)", "bins", "seconds"],
        rows,
    )
    return BenchResult(
        16,
        "SFT packing efficiency against TRL and Axolotl",
        __doc__.split("\n", 2)[2].strip(),
        [table],
        verdicts,
        notes,
        time.perf_counter() - t_start,
    )


if __name__ == "__main__":
    print(main().markdown())
