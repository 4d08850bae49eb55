"""A sharded build killed between two shards, for tests/test_sharded_faults.py: runs ``detsampler build ARGV`` and
SIGKILLs itself as soon as shard ``KILL_AFTER``'s claim is written (its index complete, the next shard not begun).

    python -m tests._sharded_kill_child KILL_AFTER ARGV...
"""

from __future__ import annotations

import os
import signal
import sys

import detsampler.index.shards as shards
from detsampler.cli import main


def run(argv: list[str]) -> int:
    kill_after, build_one = int(argv[0]), shards._build_one

    def build_then_die(files, tokenizer, root, j, *rest):
        done = build_one(files, tokenizer, root, j, *rest)
        if j == kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
        return done

    shards._build_one = build_then_die  # build_shards calls it by its module name (one process: --num-proc 1)
    return main(argv[1:])


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
