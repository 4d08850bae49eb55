"""Argument checks shared by every tier: one place that says what an integer argument is.

Invariant: :func:`check_int` accepts Python and numpy integers only (``bool``, floats, strings and integral floats such
as ``2.0`` are refused, never coerced) and returns a Python ``int``; the error names the argument, what it got and what
is allowed (tests/test_foundations.py).
"""

from __future__ import annotations

import numbers
import os
import re
from typing import Any

__all__ = ["check_int", "check_local_path", "check_positive_int", "is_int"]


def is_int(value: Any) -> bool:
    """Whether ``value`` is an integer (Python or numpy), not a ``bool``."""
    if type(value) is int:  # the common case, without the ABC check
        return True
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_int(value: Any, name: str, minimum: int | None = None, maximum: int | None = None) -> int:
    """``value`` as an ``int``, or a ValueError naming ``name`` unless it is an integer in ``[minimum, maximum]``.

    Args:
        value: the argument as received.
        name: the argument's name, for the message.
        minimum: the smallest allowed value (None: no bound).
        maximum: the largest allowed value (None: no bound).
    """
    if not is_int(value):
        raise ValueError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be an integer <= {maximum}, got {value!r}")
    return int(value)


def check_positive_int(value: Any, name: str) -> int:
    """``value`` as an ``int`` if it is an integer >= 1, else a ValueError naming ``name``."""
    return check_int(value, name, minimum=1)


_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def check_local_path(path: str | os.PathLike, what: str) -> str:
    """``path`` as a local path: a ``file://`` URL is the path after it (as :func:`detsampler.storage.parse_location`
    reads it); any other URL (``s3://``, ``gs://``, ``hf://``, ...) is a ValueError naming ``what``: only local paths
    are read here, and a URL taken as one would only be reported as a path that does not exist."""
    text = os.fspath(path) if isinstance(path, (str, os.PathLike)) else path
    match = _URL.match(text) if isinstance(text, str) else None
    if match and match.group(1).lower() == "file":
        return text[match.end() :]
    if match:
        raise ValueError(
            f"{what}: {text!r} is on remote storage ({match.group(1)}://), which is not supported: copy it to a local"
            " path"
        )
    return text
