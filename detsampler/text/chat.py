"""Chat and instruction data: rendering a ``messages`` column with a tokenizer's chat template, or ``prompt`` /
``completion`` columns, into token ids and a per-token loss mask under a policy.

Invariant: example ``d`` renders to ``ids`` (no special token added beyond what the chat template writes) and ``mask``
(uint8, one per id): ``mask[t] == 1`` exactly when token ``t`` is a trained *target* (the label that predicts it counts
in the loss). The EOS an index appends after each example is trained exactly when :attr:`ChatConfig.eos_trained`
(policies ``all`` and ``completion``: the completion ends with it, as TRL appends it; a chat template ends each
assistant turn itself). Policies:

- ``assistant``: the tokens the template marks with ``{% generation %}`` (transformers' ``assistant_masks``);
- ``last_turn``: the last contiguous run of those tokens only;
- ``completion``: ``prompt``/``completion`` data: the tokens past the prompt's (prompt and prompt + completion encoded
  as TRL's ``SFTTrainer`` does, the mask starting where the two encodings first differ: a token merged across the
  boundary is trained, as there);
- ``all``: every token.

The identity of a configuration (:meth:`ChatConfig.identity`) holds the policy, the columns and the sha256 of the chat
template's text: an index built under another template or policy has another cache key and data fingerprint.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "CHAT_POLICIES",
    "ChatConfig",
    "render_conversations",
    "render_examples",
    "resolve_template",
    "with_tools",
]

CHAT_POLICIES = ("assistant", "last_turn", "completion", "all")
_MESSAGE_POLICIES = ("assistant", "last_turn", "all")
_PROMPT_POLICIES = ("completion", "all")
_GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")


@dataclass(frozen=True, kw_only=True)
class ChatConfig:
    """How chat rows become tokens and a loss mask.

    ``column`` holds each example's messages (a list of ``{"role", "content"}`` dicts; an assistant turn may have
    ``content`` None with ``tool_calls``, the OpenAI format), or, with ``completion_column`` set, its prompt (a string)
    while ``completion_column`` holds its completion. ``tools_column``: the column of each example's tool schemas (a
    list of dicts, or their JSON text), passed to the chat template as ``tools=`` as TRL's ``SFTTrainer`` passes its
    ``tools`` column (:func:`with_tools` sets it when the dataset has one). ``policy`` picks the trained tokens (see the
    module doc); ``chat_template`` replaces the tokenizer's own template (its text).
    """

    column: str = "messages"
    completion_column: str | None = None
    policy: str = "assistant"
    chat_template: str | None = None
    tools_column: str | None = None

    def __post_init__(self) -> None:
        if self.tools_column is not None and self.completion_column is not None:
            raise ValueError(
                "ChatConfig.tools_column is for a messages column (prompt/completion strings take no tools)"
            )
        for name in ("column", "completion_column", "tools_column"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"ChatConfig.{name} must be a non-empty column name, got {value!r}")
        allowed = _PROMPT_POLICIES if self.is_prompt_completion else _MESSAGE_POLICIES
        if self.policy not in allowed:
            kind = "prompt/completion columns" if self.is_prompt_completion else "a messages column"
            raise ValueError(f"Got policy {self.policy!r}, allowed policies for {kind} are {', '.join(allowed)}")
        if self.chat_template is not None and (not isinstance(self.chat_template, str) or not self.chat_template):
            raise ValueError(
                f"ChatConfig.chat_template must be a non-empty template text or None, got {self.chat_template!r}"
            )

    @property
    def is_prompt_completion(self) -> bool:
        return self.completion_column is not None

    @property
    def columns(self) -> tuple[str, ...]:
        """The rendered columns: the messages (and tools), or the prompt and completion."""
        if self.completion_column is not None:
            return (self.column, self.completion_column)
        return (self.column,) if self.tools_column is None else (self.column, self.tools_column)

    @property
    def eos_trained(self) -> bool:
        """Whether the EOS after each example is a trained target (see the module doc)."""
        return self.policy in ("all", "completion")

    def identity(self, template: str | None) -> dict:
        """What an index records and keys on: the columns, the policy and the sha256 of the template text used."""
        sha = None if template is None else hashlib.sha256(template.encode()).hexdigest()
        tools = {} if self.tools_column is None else {"tools_column": self.tools_column}  # older keys unchanged
        return {"columns": list(self.columns), "policy": self.policy, "template_sha256": sha, **tools}

    def to_meta(self, template: str | None) -> dict:
        """The identity and the template text itself (on-the-fly reads render with exactly it)."""
        return {**self.identity(template), "template": template}

    @classmethod
    def from_meta(cls, meta: dict) -> ChatConfig:
        tools = meta.get("tools_column")
        columns = [c for c in meta["columns"] if c != tools]
        return cls(
            column=columns[0],
            completion_column=columns[1] if len(columns) > 1 else None,
            policy=meta["policy"],
            chat_template=meta.get("template"),
            tools_column=tools,
        )


def with_tools(config: ChatConfig | None, dataset: Any) -> ChatConfig | None:
    """``config`` with ``tools_column="tools"`` when it renders messages and ``dataset`` has a ``tools`` column (what
    TRL's ``SFTTrainer`` passes to the chat template); a ``chat_template_kwargs`` column, which TRL also applies per
    example, is refused: its tokens would differ from TRL's."""
    names = list(getattr(dataset, "column_names", None) or [])
    if config is None or config.is_prompt_completion:
        return config
    if "chat_template_kwargs" in names:
        raise ValueError(
            "the dataset has a chat_template_kwargs column (per-example keyword arguments of the chat template, which"
            " TRL applies): detsampler does not render them; drop the column or render those rows into messages"
        )
    if config.tools_column is None and "tools" in names:
        return dataclasses.replace(config, tools_column="tools")
    return config


def _chat_backend(tokenizer: Any) -> Any:
    """The ``transformers`` tokenizer behind ``tokenizer`` (what renders a chat template), or a ValueError."""
    inner = tokenizer if hasattr(tokenizer, "apply_chat_template") else getattr(tokenizer, "_tok", None)
    if inner is None or not hasattr(inner, "apply_chat_template"):
        raise ValueError(
            f"a messages column needs a transformers tokenizer directory to render its chat template, got "
            f"{type(tokenizer).__name__} ({getattr(tokenizer, 'path', '?')!r}); load the directory with "
            "detsampler.text.load_tokenizer(dir)"
        )
    return inner


def resolve_template(config: ChatConfig, tokenizer: Any) -> str | None:
    """The template text ``config`` renders with (None for prompt/completion columns): its own, else the
    tokenizer's. A ValueError when there is none, or when the policy needs ``{% generation %}`` markers it lacks."""
    if config.is_prompt_completion:
        return None
    template = config.chat_template or getattr(_chat_backend(tokenizer), "chat_template", None)
    if not isinstance(template, str) or not template:
        raise ValueError(
            f"tokenizer {getattr(tokenizer, 'path', '?')!r} has no chat template: pass ChatConfig(chat_template=...)"
        )
    if config.policy in ("assistant", "last_turn") and not _GENERATION.search(template):
        raise ValueError(
            f"policy {config.policy!r} needs a chat template that marks assistant tokens with {{% generation %}} ..."
            " {% endgeneration %}; this one has no such marker: use one that does, or policy='all'"
        )
    return template


def _check_messages(messages: Any, doc: int, column: str) -> None:
    """Raise a ValueError naming document ``doc`` unless ``messages`` is a non-empty list of messages with a role
    (str) and a content (str; None only on a turn with ``tool_calls``, a non-empty list of dicts: the OpenAI format)."""
    ok = isinstance(messages, list) and len(messages) > 0
    for i, m in enumerate(messages if ok else ()):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            ok = False
            break
        calls = m.get("tool_calls")
        if calls is not None and (
            not isinstance(calls, list) or not calls or not all(isinstance(c, dict) for c in calls)
        ):
            raise ValueError(
                f"document {doc}: message {i} of column {column!r} has tool_calls {str(calls)[:60]!r}, not a non-empty"
                " list of {'type': 'function', 'function': {'name', 'arguments'}} dicts"
            )
        content = m.get("content")
        if not isinstance(content, str) and not (content is None and calls is not None):
            got = "None without tool_calls" if content is None else f"a {type(content).__name__}"
            raise ValueError(
                f"document {doc}: message {i} of column {column!r} ({m.get('role')}) holds content {got}: a content is"
                " a string (None only on an assistant turn with tool_calls); content parts (lists) are not rendered"
                " here"
            )
    if not ok:
        got = "None" if messages is None else f"{type(messages).__name__} {str(messages)[:60]!r}"
        raise ValueError(
            f"document {doc}: column {column!r} holds {got}, not a non-empty list of {{'role': str, 'content': str}}"
            " messages; drop or fill such rows first"
        )


def _tools(value: Any, doc: int, column: str) -> list | None:
    """An example's tool schemas as the chat template takes them: a list of dicts (JSON text parsed, as TRL does), or
    None when it has none."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"document {doc}: column {column!r} holds text that is not JSON ({exc.msg})") from None
    if value is None or (isinstance(value, list) and all(isinstance(t, dict) for t in value)):
        return value
    raise ValueError(
        f"document {doc}: column {column!r} holds {type(value).__name__} {str(value)[:60]!r}, not a list of tool"
        " schemas (dicts, or their JSON text)"
    )


def _last_run(mask: np.ndarray) -> np.ndarray:
    """``mask`` with only its last contiguous run of ones kept."""
    ones = np.flatnonzero(mask)
    if ones.size == 0:
        return mask
    end = int(ones[-1])
    zeros_before = np.flatnonzero(mask[:end] == 0)
    start = int(zeros_before[-1]) + 1 if zeros_before.size else 0
    out = np.zeros_like(mask)
    out[start : end + 1] = 1
    return out


def _render_messages(
    tokenizer: Any,
    conversations: Sequence[Any],
    first_doc: int,
    config: ChatConfig,
    template: str,
    tools: Sequence[Any] | None = None,
) -> tuple[list[list[int]], list[np.ndarray]]:
    for i, messages in enumerate(conversations):
        _check_messages(messages, first_doc + i, config.column)
    return render_conversations(tokenizer, conversations, config, template, tools, first_doc)


def render_conversations(
    tokenizer: Any,
    conversations: Sequence[Any],
    config: ChatConfig,
    template: str,
    tools: Sequence[Any] | None = None,
    first_doc: int = 0,
) -> tuple[list[list[int]], list[np.ndarray]]:
    """Each conversation (checked by the caller) rendered with ``template``, with its row's ``tools`` where given
    (documents ``first_doc, ...``): its ids and its mask under ``config.policy`` (see the module doc). Multimodal
    contents (lists of parts) render as the template writes them."""
    if not conversations:
        return [], []
    render = dict(
        chat_template=template,
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=config.policy != "all",
    )
    backend = _chat_backend(tokenizer)
    if tools is None:
        out = backend.apply_chat_template(list(conversations), **render)
    else:  # NOTE: each example with its own tools (the template takes one tools= per call), as TRL renders them
        parts = [
            backend.apply_chat_template(m, tools=_tools(t, first_doc + i, str(config.tools_column)), **render)
            for i, (m, t) in enumerate(zip(conversations, tools))
        ]
        out = {key: [p[key] for p in parts] for key in parts[0]}
    ids = [list(x) for x in out["input_ids"]]
    if config.policy == "all":
        return ids, [np.ones(len(x), dtype=np.uint8) for x in ids]
    masks = [np.asarray(m, dtype=np.uint8) for m in out["assistant_masks"]]
    if config.policy == "last_turn":
        masks = [_last_run(m) for m in masks]
    return ids, masks


def _render_prompts(
    tokenizer: Any, prompts: Sequence[Any], completions: Sequence[Any], first_doc: int, config: ChatConfig
) -> tuple[list[list[int]], list[np.ndarray]]:
    for column, values in ((config.column, prompts), (config.completion_column, completions)):
        for i, value in enumerate(values):
            if not isinstance(value, str):
                got = "None" if value is None else f"a {type(value).__name__}"
                raise ValueError(
                    f"document {first_doc + i}: column {column!r} holds {got}, not a string; drop or fill such rows"
                )
    prompt_ids = tokenizer.encode_batch(list(prompts))
    ids = [list(x) for x in tokenizer.encode_batch([p + c for p, c in zip(prompts, completions)])]
    if config.policy == "all":
        return ids, [np.ones(len(x), dtype=np.uint8) for x in ids]
    return ids, [(np.arange(len(x)) >= _common_prefix(x, p)).astype(np.uint8) for x, p in zip(ids, prompt_ids)]


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading ids ``a`` and ``b`` share (vectorized: one comparison per example, none per token in Python)."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(differ[0]) if differ.size else n


def render_examples(
    tokenizer: Any, rows: dict[str, Sequence[Any]], first_doc: int, config: ChatConfig, template: str | None
) -> tuple[list[list[int]], list[np.ndarray]]:
    """Each example's token ids and loss mask (see the module doc); ``rows`` maps ``config.columns`` to the values of
    documents ``first_doc, ...``; ``template`` is :func:`resolve_template`'s. A ValueError names the first bad row."""
    if config.is_prompt_completion:
        return _render_prompts(tokenizer, rows[config.column], rows[config.completion_column], first_doc, config)
    assert template is not None
    tools = rows[config.tools_column] if config.tools_column is not None else None
    return _render_messages(tokenizer, rows[config.column], first_doc, config, template, tools)
