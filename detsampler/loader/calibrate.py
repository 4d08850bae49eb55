"""Calibrating the balanced plan's cost model: time real attention with per-document masks, fit ``a * sum(l**2) + b *
tokens + c``.

A reference model (:class:`ReferenceModel`: ``n_layers`` pre-norm blocks of ``dim`` channels, ``n_heads`` heads, a
``4 * dim`` MLP) runs forward and backward over one packed sample of ``sum(l)`` tokens whose attention is masked per
document: each document span attends causally within itself, computed the way varlen kernels (flash-attn's
``varlen``, cuDNN's packed sequences) do it, one causal ``scaled_dot_product_attention`` per span, so the work grows
with ``sum(l**2)``, not ``(sum l)**2``. (A single SDPA call with a dense block-diagonal mask computes every one of the
``(sum l)**2`` scores whatever the documents: a model that attends that way costs the same for every sample of a
length, and has nothing to balance.) ``kernel="flex"`` times flex attention with a block mask instead (forward only:
the installed torch has no flex backward on CPU), where its ``torch.compile`` works.

:func:`calibrate` times span compositions (one document of ``L`` tokens, 2 of ``L/2``, 4 of ``L/4``, ..., mixed) at
each ``seq_len``, the best of ``repeats`` runs each, alternating the compositions between runs (a shared machine's load
then hits every composition alike), and fits the three coefficients by least squares, none negative. The result is a
:class:`~detsampler.balance.CostModel` in units of one token's linear work (``linear = 1``), the form the plan
records. Run it on the GPU you train on: ``python -m detsampler.loader.calibrate --device cuda --dim 4096 --n-heads 32
--seq-lens 8192,32768``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from detsampler.balance import CostModel

__all__ = ["Calibration", "CalibrationConfig", "ReferenceModel", "calibrate", "compositions", "time_sample"]

KERNELS = ("sdpa", "flex")


@dataclass(frozen=True, kw_only=True)
class CalibrationConfig:
    """The reference model and what to time: ``seq_lens`` (tokens per sample), ``repeats`` (best of), ``threads``
    (torch's intra-op threads on CPU; 0: leave torch's setting), ``kernel`` (``sdpa``: per-document causal SDPA,
    forward and backward; ``flex``: flex attention with a document block mask, forward only)."""

    dim: int = 32
    n_heads: int = 2
    n_layers: int = 1
    seq_lens: tuple[int, ...] = (2048, 4096, 8192, 16384)
    min_document: int = 256
    repeats: int = 3
    device: str = "cpu"
    threads: int = 1
    kernel: str = "sdpa"
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("dim", "n_heads", "n_layers", "min_document", "repeats"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"CalibrationConfig.{name} must be an integer >= 1, got {value!r}")
        if self.dim % self.n_heads:
            raise ValueError(f"CalibrationConfig.dim ({self.dim}) must be divisible by n_heads ({self.n_heads})")
        if not self.seq_lens or any(not isinstance(n, int) or n < self.min_document for n in self.seq_lens):
            raise ValueError(
                f"CalibrationConfig.seq_lens must be integers >= min_document ({self.min_document}), got"
                f" {self.seq_lens!r}"
            )
        if self.kernel not in KERNELS:
            raise ValueError(f"CalibrationConfig.kernel must be one of {KERNELS}, got {self.kernel!r}")


class ReferenceModel(nn.Module):
    """``n_layers`` pre-norm transformer blocks over a packed sample, attention masked per document span."""

    def __init__(self, dim: int, n_heads: int, n_layers: int, kernel: str = "sdpa") -> None:
        super().__init__()
        self.n_heads, self.kernel = n_heads, kernel
        self.layers = nn.ModuleList(
            nn.ModuleDict(
                {
                    "norm1": nn.LayerNorm(dim),
                    "qkv": nn.Linear(dim, 3 * dim, bias=False),
                    "out": nn.Linear(dim, dim, bias=False),
                    "norm2": nn.LayerNorm(dim),
                    "up": nn.Linear(dim, 4 * dim, bias=False),
                    "down": nn.Linear(4 * dim, dim, bias=False),
                }
            )
            for _ in range(n_layers)
        )

    def forward(self, x: torch.Tensor, lengths: Sequence[int], block_mask: object = None) -> torch.Tensor:
        """``x``: ``[tokens, dim]``, the spans of ``lengths`` one after the other."""
        for layer in self.layers:
            q, k, v = layer["qkv"](layer["norm1"](x)).chunk(3, dim=-1)
            heads = lambda t: t.reshape(t.shape[0], self.n_heads, -1).transpose(0, 1).unsqueeze(0)
            q, k, v = heads(q), heads(k), heads(v)
            if self.kernel == "flex":
                att = _flex()(q, k, v, block_mask=block_mask)
            else:
                parts, at = [], 0
                for n in lengths:  # NOTE: what a varlen kernel computes: each document attends within itself
                    sl = slice(at, at + n)
                    parts.append(F.scaled_dot_product_attention(q[:, :, sl], k[:, :, sl], v[:, :, sl], is_causal=True))
                    at += n
                att = torch.cat(parts, dim=2)
            x = x + layer["out"](att.squeeze(0).transpose(0, 1).reshape(x.shape))
            x = x + layer["down"](F.gelu(layer["up"](layer["norm2"](x))))
        return x


_FLEX: list = []


def _flex():
    if not _FLEX:
        from torch.nn.attention.flex_attention import flex_attention

        _FLEX.append(torch.compile(flex_attention, dynamic=False))
    return _FLEX[0]


def _block_mask(lengths: Sequence[int], device: str) -> object:
    from torch.nn.attention.flex_attention import create_block_mask

    doc = torch.repeat_interleave(torch.arange(len(lengths), device=device), torch.tensor(lengths, device=device))
    total = int(sum(lengths))
    return create_block_mask(lambda b, h, q, k: (doc[q] == doc[k]) & (q >= k), 1, 1, total, total, device=device)


def time_sample(model: ReferenceModel, lengths: Sequence[int], device: str = "cpu", backward: bool = True) -> float:
    """Seconds of one forward (and backward) of ``model`` over a sample of document spans ``lengths``."""
    dim = model.layers[0]["qkv"].in_features
    x = torch.randn(int(sum(lengths)), dim, device=device, requires_grad=backward)
    mask = _block_mask(lengths, device) if model.kernel == "flex" else None
    _sync(device)
    start = time.perf_counter()
    with torch.set_grad_enabled(backward):
        out = model(x, lengths, mask)
        if backward:
            out.sum().backward()
    _sync(device)
    return time.perf_counter() - start


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def compositions(seq_len: int, min_document: int = 64) -> list[tuple[int, ...]]:
    """Span lengths of samples of ``seq_len`` tokens: ``2**i`` documents of ``seq_len / 2**i`` (down to
    ``min_document``), and halves of halves (``L/2, L/4, ..., the rest``)."""
    out, parts = [], 1
    while seq_len // parts >= min_document:
        size = seq_len // parts
        out.append((size,) * parts + ((seq_len - size * parts,) if seq_len - size * parts else ()))
        parts *= 2
    halves, rest = [], seq_len
    while rest > min_document:
        halves.append(rest // 2)
        rest -= rest // 2
    out.append((*halves, rest))
    return out


@dataclass(frozen=True)
class Calibration:
    """The fitted :attr:`cost` (``linear = 1``), the raw fit in seconds (``seconds``: ``attention``, ``linear``,
    ``fixed``), and each timed composition: ``rows`` of ``(sum of squares, tokens, best seconds, fitted seconds)``."""

    cost: CostModel
    seconds: dict[str, float]
    rows: list[tuple[int, int, float, float]] = field(repr=False)
    config: CalibrationConfig = field(repr=False)

    @property
    def max_relative_error(self) -> float:
        return max(abs(fit - got) / got for _, _, got, fit in self.rows)


def _fit(squares: np.ndarray, tokens: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """Least squares of ``seconds ~ a * squares + b * tokens + c`` with ``a, b, c >= 0``, relative errors weighted
    alike (each row divided by its time): the fit over every subset of the three columns, the best nonnegative one."""
    design = np.stack([squares, tokens, np.ones_like(tokens)], axis=1).astype(np.float64) / seconds[:, None]
    target = np.ones(len(seconds))
    best, best_err = np.zeros(3), np.inf
    for keep in ([0, 1, 2], [0, 1], [1, 2], [0, 2], [1], [0]):
        coef, *_ = np.linalg.lstsq(design[:, keep], target, rcond=None)
        if (coef < 0).any():
            continue
        full = np.zeros(3)
        full[keep] = coef
        err = float(((design @ full - target) ** 2).sum())
        if err < best_err:
            best, best_err = full, err
    return best


def calibrate(config: CalibrationConfig = CalibrationConfig()) -> Calibration:
    """Time the reference model over span compositions at each ``seq_len`` and fit the cost model (module doc)."""
    threads = torch.get_num_threads()
    if config.threads and config.device == "cpu":
        torch.set_num_threads(config.threads)
    try:
        return _calibrate(config)
    finally:
        torch.set_num_threads(threads)


def _calibrate(config: CalibrationConfig) -> Calibration:
    torch.manual_seed(config.seed)
    model = ReferenceModel(config.dim, config.n_heads, config.n_layers, config.kernel).to(config.device)
    samples = [c for n in config.seq_lens for c in compositions(n, config.min_document)]
    backward = config.kernel == "sdpa"
    best = np.full(len(samples), np.inf)
    time_sample(model, samples[0], config.device, backward)  # warm-up (and flex's compile)
    for _ in range(config.repeats):  # NOTE: alternate the compositions: load changes hit all of them alike
        for i, lengths in enumerate(samples):
            best[i] = min(best[i], time_sample(model, lengths, config.device, backward))
    squares = np.array([sum(n * n for n in c) for c in samples], dtype=np.float64)
    tokens = np.array([sum(c) for c in samples], dtype=np.float64)
    a, b, c = _fit(squares, tokens, best)
    fitted = a * squares + b * tokens + c
    rows = [(int(s), int(t), float(g), float(f)) for s, t, g, f in zip(squares, tokens, best, fitted)]
    unit = b if b > 0 else 1.0
    cost = CostModel(attention=_round(a / unit), linear=1.0 if b > 0 else 0.0, fixed=_round(c / unit))
    return Calibration(cost, {"attention": a, "linear": b, "fixed": c}, rows, config)


def _round(x: float) -> float:
    """Three significant digits: what the fit can tell apart on a shared machine, and a readable record."""
    return float(f"{x:.3g}")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m detsampler.loader.calibrate", description="fit the balanced plan's cost model by timing"
    )
    p.add_argument("--dim", type=int, default=CalibrationConfig.dim)
    p.add_argument("--n-heads", type=int, default=CalibrationConfig.n_heads)
    p.add_argument("--n-layers", type=int, default=CalibrationConfig.n_layers)
    p.add_argument("--seq-lens", default=",".join(map(str, CalibrationConfig.seq_lens)), help="e.g. 2048,8192")
    p.add_argument("--repeats", type=int, default=CalibrationConfig.repeats)
    p.add_argument("--device", default=CalibrationConfig.device)
    p.add_argument("--threads", type=int, default=CalibrationConfig.threads)
    p.add_argument("--kernel", choices=KERNELS, default=CalibrationConfig.kernel)
    args = p.parse_args(argv)
    try:
        seq_lens = tuple(int(x) for x in args.seq_lens.split(",") if x.strip())
        config = CalibrationConfig(
            dim=args.dim,
            n_heads=args.n_heads,
            n_layers=args.n_layers,
            seq_lens=seq_lens,
            repeats=args.repeats,
            device=args.device,
            threads=args.threads,
            kernel=args.kernel,
        )
    except ValueError as exc:
        p.error(str(exc))
    result = calibrate(config)
    for squares, tokens, got, fit in result.rows:
        print(f"  tokens {tokens:>7}  sum(l^2) {squares:>13}  {got * 1e3:9.2f} ms  fit {fit * 1e3:9.2f} ms")
    s = result.seconds
    print(
        f"seconds = {s['attention']:.4g} * sum(l^2) + {s['linear']:.4g} * tokens + {s['fixed']:.4g}"
        f" (largest error {result.max_relative_error:.1%})"
    )
    c = result.cost
    print(f"CostModel(attention={c.attention!r}, linear={c.linear!r}, fixed={c.fixed!r})")
    print(f"[data] balance = {{attention = {c.attention!r}, linear = {c.linear!r}, fixed = {c.fixed!r}}}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
