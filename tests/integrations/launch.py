"""Start ``world_size`` CPU processes of a child module as a torch.distributed job (gloo), the way torchrun would."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import traceback
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(module: str, world_size: int, *args: str) -> list[subprocess.Popen]:
    """Start ``python -m module *args`` on ranks 0..world_size-1 with the torch.distributed environment."""
    port = str(free_port())
    procs = []
    for rank in range(world_size):
        env = dict(
            os.environ,
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world_size),
            LOCAL_WORLD_SIZE=str(world_size),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
            OMP_NUM_THREADS="1",
            TOKENIZERS_PARALLELISM="false",
            HF_HUB_OFFLINE="1",
            WANDB_MODE="disabled",
            PYTHONPATH=str(ROOT),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", module, *args],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    return procs


def wait(procs: list[subprocess.Popen], timeout: float = 300) -> list[subprocess.CompletedProcess]:
    """Each rank's completed process (return code and output), once all have exited; kills all on a timeout."""
    done = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out))
    return done


def launch(module: str, world_size: int, *args: str, timeout: float = 300) -> list[subprocess.CompletedProcess]:
    """:func:`start` then :func:`wait`."""
    return wait(start(module, world_size, *args), timeout)


def check(runs: list[subprocess.CompletedProcess]) -> list[str]:
    """The outputs of ranks that all exited 0 (else an assertion error showing the failed rank's output tail)."""
    for rank, run in enumerate(runs):
        assert run.returncode == 0, f"rank {rank} exited {run.returncode}:\n{run.stdout[-4000:]}"
    return [run.stdout for run in runs]


def read_steps(path: Path) -> dict[int, list[list[int]]]:
    """The micro batches (sample ids) each step read, from a rank's ids file of ``{"step": s, "ids": [...]}`` lines."""
    out: dict[int, list[list[int]]] = defaultdict(list)
    for line in Path(path).read_text().splitlines():
        row = json.loads(line)
        out[row["step"]].append(row["ids"])
    return dict(out)


def audited(capsys, checkpoint: Path) -> str:
    """The output of ``detsampler show --checkpoint CHECKPOINT`` (its last trained step), run in this process."""
    from detsampler.cli import main

    capsys.readouterr()
    assert main(["show", "--checkpoint", str(checkpoint)]) == 0
    return capsys.readouterr().out


def exit_without_teardown(main) -> None:
    """Run a child's ``main``, then leave the process with its exit code (1 after a traceback) without the interpreter's
    teardown.

    NOTE: after a run has trained and written everything, the teardown of gloo's and the frameworks' native threads can
    abort the process ("terminate called without an active exception", exit -6), even after
    ``destroy_process_group``: seen in fresh-clone runs of the HF child. What a child reports is written and flushed
    before it exits, so skipping the teardown loses nothing and keeps the exit code the run's.
    """
    import torch.distributed as dist

    code = 0
    try:
        main()
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
