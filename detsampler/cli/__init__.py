"""The ``detsampler`` command: train a tokenizer, build an index, and explain, verify and summarize a plan over it.

Options map one to one onto the library's dataclasses:

- index options -> :class:`detsampler.index.prepare.IndexConfig` (``--data``, ``--text-column``, ``--tokenizer``,
``--vocab-size``,
  ``--cache-dir``, ``--num-proc``, ``--store-tokens/--no-store-tokens``, ``--max-documents``);
- layout options -> :class:`detsampler.layout.LayoutConfig` (``--kind``, ``--seq-len``, ``--layout-seed`` for its
``seed``,
  ``--window-docs``);
- plan options -> :class:`detsampler.plan.Plan` (``--seed``, ``--global-batch-size``, ``--micro-batch-size``,
  ``--world-size``, ``--batch-size-schedule``, ``--skip-steps``); the plan's ``num_samples`` is the layout's;
- mixture options -> :class:`detsampler.mixture.MixtureConfig` (``--mixture-data`` for its ``sources``,
  ``--mixture-weights``, ``--mixture-schedule``, ``--mixture-seed``, ``--mixture-names``). With ``--mixture-data``, each
  source
  is indexed like ``--data`` (the other index options are shared, and so is the tokenizer: ``--tokenizer``, or else the
  default one trained on the standard library), cut by the same layout options, and the plan draws from their mixture.

``show``, ``verify``, ``stats`` and ``where`` take ``--checkpoint PATH`` instead: the data record a checkpoint saves
gives the index, layout and plan options (:mod:`detsampler.cli.checkpoint`); an option given explicitly that
contradicts it is refused (:func:`detsampler.cli.parser.explicit_options` tells typed options from defaults).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from detsampler.cli.build import cmd_build, cmd_tokenizer_train
from detsampler.cli.erase import cmd_erase
from detsampler.cli.inputs import quiet_progress
from detsampler.cli.options import OPTION_FIELDS
from detsampler.cli.parser import build_parser, explicit_options, join_negative_values
from detsampler.cli.push import cmd_push
from detsampler.cli.report import json_stdout
from detsampler.cli.show import cmd_show
from detsampler.cli.stats import cmd_stats
from detsampler.cli.verify import cmd_verify
from detsampler.cli.where import cmd_where

__all__ = ["OPTION_FIELDS", "build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """The ``detsampler`` entry point. Bad input is reported as ``detsampler: error: ...`` with exit status 2."""
    parser = build_parser()
    argv = join_negative_values(list(sys.argv[1:] if argv is None else argv))
    args = parser.parse_args(argv)
    if args.command in ("show", "verify", "stats", "build", "where"):
        args.explicit = explicit_options(argv)  # --checkpoint refuses an option that contradicts it, default or not
    quiet_progress(getattr(args, "quiet", False))
    show_library_log(logging.WARNING if getattr(args, "quiet", False) else logging.INFO)
    commands = {"build": cmd_build, "show": cmd_show, "verify": cmd_verify, "stats": cmd_stats, "where": cmd_where}
    commands["push"] = cmd_push
    commands["erase"] = cmd_erase
    try:
        if args.command == "tokenizer":
            return cmd_tokenizer_train(args)
        with json_stdout(getattr(args, "json", False)):  # --json: one JSON document on stdout, the rest on stderr
            return commands[args.command](args)
    except (
        ValueError,
        TypeError,
    ) as exc:  # every bad input is a ValueError (TypeError: a wrong type) naming what is wrong
        parser.exit(2, f"detsampler: error: {_one_line(exc)}\n")
    except OSError as exc:  # permission denied, disk full, a path that is a file: the system's words and the path
        where = f": {exc.filename}" if exc.filename is not None else ""
        parser.exit(2, f"detsampler: error: {exc.strerror or _one_line(exc)}{where}\n")
    return 0  # pragma: no cover


def show_library_log(level: int = logging.INFO) -> None:
    """Print the library's log (logger ``detsampler``: builds, tokenizer training, corpus hashing) on stderr, once."""
    log = logging.getLogger("detsampler")
    if not any(isinstance(h, _StderrHandler) for h in log.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
    log.setLevel(level)


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time of each record (it may be replaced after set-up)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
