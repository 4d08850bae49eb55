"""SFT data as TRL takes it (issue 32, item 4): a ``tools`` column passed to the chat template (it was silently ignored:
our tokens differed from TRL's), assistant turns with ``content: None`` and ``tool_calls`` (the OpenAI format; they were
refused), each checked by value against TRL's own ``SFTTrainer`` preprocessing; and a loud refusal for what is not
understood (content parts, a null content without tool calls, malformed tool calls or tools, per-example
``chat_template_kwargs``)."""

from __future__ import annotations

import json

import datasets
import numpy as np
import pytest

from detsampler.content import content_hash, documents_by_content
from detsampler.index import build_index
from detsampler.text.chat import ChatConfig
from tests.chat_data import conversations, make_chat_tokenizer
from tests.test_chat_trl import _trl_prepared

pytest.importorskip("trl")

# the tokenizer's template, extended as real ones (Qwen, Llama 3.1) are: the tools in a system turn, each tool call of
# an assistant turn after its content (if any), and tool results as their own turns
TOOLS_TEMPLATE = (
    "{% if tools %}<|begin_of_text|>system\nTools: {{ tools | tojson }}<|endoftext|>\n{% endif %}"
    "{% for m in messages %}{% if m['role'] == 'assistant' %}<|begin_of_text|>assistant\n{% generation %}"
    "{% if m['content'] %}{{ m['content'] }}{% endif %}"
    "{% if m['tool_calls'] %}{% for c in m['tool_calls'] %}<call>{{ c['function']['name'] }}"
    "({{ c['function']['arguments'] }})</call>{% endfor %}{% endif %}<|endoftext|>{% endgeneration %}\n"
    "{% else %}<|begin_of_text|>{{ m['role'] }}\n{{ m['content'] }}<|endoftext|>\n{% endif %}{% endfor %}"
)

WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}


def tool_rows(num: int = 12) -> list[dict]:
    """Conversations where every third one calls a tool (its assistant turn: content None, one tool call, then the
    tool's answer and a final reply) with the tools as JSON text, as xLAM-style datasets keep them; others have none."""
    rows = []
    for i, turns in enumerate(conversations(num, seed=11)):
        if i % 3 == 0:
            call = {"type": "function", "function": {"name": "weather", "arguments": json.dumps({"city": f"c{i}"})}}
            turns = turns[:1] + [
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "content": f"sunny {i}"},
                {"role": "assistant", "content": f"It is sunny in c{i}."},
            ]
        rows.append({"messages": turns, "tools": json.dumps([WEATHER]) if i % 3 == 0 else None})
    return rows


def test_tools_and_tool_calls_render_as_trl_renders_them(tmp_path):
    tok = make_chat_tokenizer(tmp_path / "tok", template=TOOLS_TEMPLATE)
    data = datasets.Dataset.from_list(tool_rows())
    prepared = _trl_prepared(data, tmp_path / "tok", tmp_path, assistant_only_loss=True)
    index = build_index(data, tok, cache_dir=tmp_path / "cache", progress=False, chat=ChatConfig(policy="assistant"))
    assert index.chat.tools_column == "tools" and index.chat.columns == ("messages", "tools")
    for d, row in enumerate(prepared):
        mask = np.asarray(index.loss_mask[index.offsets[d] : index.offsets[d + 1]]).astype(bool).tolist()
        assert row["input_ids"] == index.document_tokens(d).tolist(), d
        assert [label != -100 for label in row["labels"]] == mask, d
    called = tok._tok.encode("<call>weather(", add_special_tokens=False)
    assert all(called[0] in index.document_tokens(d).tolist() for d in (0, 3, 6))  # the tool call is rendered
    # a row's content hash covers its rendered columns, tools included
    row = {"messages": tool_rows()[3]["messages"], "tools": data[3]["tools"]}
    assert documents_by_content(data, [content_hash(row)], ("messages", "tools")) == [3]


def test_what_the_chat_renderer_does_not_understand_is_refused_in_one_line(tmp_path):
    tok = make_chat_tokenizer(tmp_path / "tok", template=TOOLS_TEMPLATE)
    user = {"role": "user", "content": "hi"}
    cases = [
        ({"messages": [[{"role": "user", "content": [{"type": "text", "text": "x"}]}]]}, "holds content a list"),
        ({"messages": [[user, {"role": "assistant", "content": None}]]}, "holds content None without tool_calls"),
        ({"messages": [[user, {"role": "assistant", "content": None, "tool_calls": "weather()"}]]}, "has tool_calls"),
        ({"messages": [[user]], "tools": ["{not json"]}, "column 'tools' holds text that is not JSON"),
        ({"messages": [[user]], "tools": [json.dumps({"name": "w"})]}, "not a list of tool schemas"),
        ({"messages": [[user]], "chat_template_kwargs": [{"enable_thinking": True}]}, "chat_template_kwargs column"),
    ]
    for i, (columns, message) in enumerate(cases):
        data = datasets.Dataset.from_dict(columns)
        with pytest.raises(ValueError) as e:
            build_index(data, tok, cache_dir=tmp_path / f"c{i}", progress=False, chat=ChatConfig(policy="assistant"))
        assert message in str(e.value) and "\n" not in str(e.value), (i, str(e.value))
