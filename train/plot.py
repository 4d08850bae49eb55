"""Loss curves of one or more runs, with resume points marked, as a PNG.

    python -m train.plot RUN_DIR [RUN_DIR ...] [--out loss.png] [--title TEXT]

Each run's ``metrics.jsonl`` is read with resumes applied (:func:`train.metrics.read_metrics`); every ``resumed_from``
event is drawn as a vertical dashed line at its step, in the run's colour, and a marker on the curve; steps that a
killed attempt had logged past its last checkpoint (and that were trained again) are grey crosses. The default output is
``RUN_DIR/loss.png`` of the first run.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from train.metrics import read_metrics

__all__ = ["main", "plot_runs"]


def plot_runs(
    run_dirs: Sequence[str | Path], out: str | Path, title: str | None = None, labels: Sequence[str] | None = None
) -> Path:
    """Draw the loss of each run against step into ``out`` (PNG). Returns the path written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    styles = ["-", "--", ":", "-."]
    for i, run_dir in enumerate(run_dirs):
        m = read_metrics(run_dir)
        if not m.steps:
            raise ValueError(f"run directory {run_dir} has no step records in metrics.jsonl")
        steps = sorted(m.steps)
        losses = [m.steps[s]["loss"] for s in steps]
        label = labels[i] if labels else Path(run_dir).name
        (line,) = ax.plot(steps, losses, styles[i % len(styles)], linewidth=1.6, label=label)
        for k, event in enumerate(m.resumes):
            s = int(event["step"])
            ax.axvline(s - 0.5, color=line.get_color(), linestyle="--", alpha=0.6, linewidth=1)
            if s in m.steps:
                ax.plot(
                    [s],
                    [m.steps[s]["loss"]],
                    "o",
                    color=line.get_color(),
                    markersize=7,
                    markerfacecolor="none",
                    label=(
                        f"resume point of {label}: step {s} ({event.get('world_size', '?')} ranks)" if k == 0 else None
                    ),
                )
        lost = [r for r in m.discarded if r.get("loss") is not None]
        if lost:
            ax.plot(
                [r["step"] for r in lost],
                [r["loss"] for r in lost],
                "x",
                color="grey",
                markersize=6,
                label=f"{label}: steps of the killed attempt, trained again after the resume",
            )
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (token mean over the global batch)")
    ax.set_title(title or "loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m train.plot", description="loss curves with resume points marked")
    p.add_argument("run_dirs", nargs="+")
    p.add_argument("--out", default=None, help="PNG path (default RUN_DIR/loss.png of the first run)")
    p.add_argument("--title", default=None)
    args = p.parse_args(argv)
    out = args.out or str(Path(args.run_dirs[0]) / "loss.png")
    print(plot_runs(args.run_dirs, out, args.title))
    return 0


if __name__ == "__main__":
    sys.exit(main())
