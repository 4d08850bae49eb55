"""Chat data with images: a ``messages`` column whose contents are strings or lists of parts, ``{"type": "image"}``
beside ``{"type": "text", "text": ...}`` (the shape transformers' chat templates and processors take), rendered with
the tokenizer's chat template under a loss policy of :mod:`detsampler.text.chat`.

Invariant: a conversation renders (:func:`detsampler.text.chat.render_conversations`) to the ids the template writes,
one image placeholder per ``{"type": "image"}`` part in order (the build expands each to its image's token count), and
the policy's mask; the build sets the mask to 0 on every image token (an image token is never a target, whatever turn
holds it). A conversation is refused, naming its document, unless it is a non-empty list of
``{"role": str, "content": str | list of parts}`` with parts of the types :data:`PART_TYPES`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PART_TYPES", "check_conversation"]

PART_TYPES = ("text", "image")


def _got(value: Any) -> str:
    return "None" if value is None else f"{type(value).__name__} {str(value)[:60]!r}"


def check_conversation(messages: Any, name: str, column: str) -> int:
    """The number of image parts of the conversation ``messages`` of document ``name``; a ValueError naming it and
    what was received unless it has the shape of the module doc."""
    if not isinstance(messages, list) or not messages:
        raise ValueError(
            f"{name}: column {column!r} holds {_got(messages)}, not a non-empty list of {{'role': str, 'content': str"
            " | [parts]}} messages; drop or fill such rows first"
        )
    images = 0
    for k, m in enumerate(messages):
        where = f"{name} {column}[{k}]"
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ValueError(f"{where}: {_got(m)} is not a {{'role': str, 'content': ...}} message")
        content = m.get("content")
        if isinstance(content, str):
            continue
        if not isinstance(content, list):
            raise ValueError(f"{where}: its content is {_got(content)}, not a string or a list of parts")
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in PART_TYPES:
                raise ValueError(
                    f"{where}: a content part of type {kind!r}; allowed types are {', '.join(map(repr, PART_TYPES))}"
                    f" (got {_got(part)})"
                )
            if kind == "text" and not isinstance(part.get("text"), str):
                raise ValueError(f"{where}: a text part whose text is {_got(part.get('text'))}, not a string")
            images += kind == "image"
    return images
