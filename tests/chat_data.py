"""A local chat corpus and tokenizer for the SFT tests: a byte-level BPE trained on standard-library text, saved as a
``transformers`` directory whose chat template marks assistant turns with ``{% generation %}``; conversations built
with ``datasets.Dataset.from_dict``. Nothing is downloaded."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np

CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'assistant' %}<|begin_of_text|>assistant\n"
    "{% generation %}{{ m['content'] }}<|endoftext|>{% endgeneration %}\n"
    "{% else %}<|begin_of_text|>{{ m['role'] }}\n{{ m['content'] }}<|endoftext|>\n{% endif %}{% endfor %}"
)
# the same turns without the markers: what policy="all" accepts and "assistant" refuses
PLAIN_TEMPLATE = CHAT_TEMPLATE.replace("{% generation %}", "").replace("{% endgeneration %}", "")


def _words() -> list[str]:
    import os

    text = Path(os.__file__).read_text()
    return [w for w in text.split() if w.isalpha()][:3000]


def make_chat_tokenizer(out_dir: Path, template: str = CHAT_TEMPLATE):
    """A 400-piece BPE directory with ``template`` in its tokenizer_config.json, loaded as a TransformersTokenizer."""
    from detsampler.text.hf import TransformersTokenizer, train_hf_bpe

    words = _words()
    train_hf_bpe([" ".join(words[i : i + 50]) for i in range(0, len(words), 50)], 400, out_dir)
    config_path = Path(out_dir) / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = template
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    return TransformersTokenizer.load(out_dir)


def conversations(num: int, seed: int = 0) -> list[list[dict]]:
    """``num`` conversations: an optional system turn, then 1 to 3 user/assistant exchanges of 1 to 30 words."""
    rng = random.Random(seed)
    words = _words()

    def say() -> str:
        return " ".join(rng.choice(words) for _ in range(rng.randint(1, 30)))

    out = []
    for _ in range(num):
        turns = [{"role": "system", "content": say()}] if rng.random() < 0.3 else []
        for _ in range(rng.randint(1, 3)):
            turns += [{"role": "user", "content": say()}, {"role": "assistant", "content": say()}]
        out.append(turns)
    return out


def chat_dataset(num: int, seed: int = 0):
    import datasets

    return datasets.Dataset.from_dict({"messages": conversations(num, seed)})


def prompt_dataset(num: int, seed: int = 0):
    import datasets

    convs = conversations(num, seed)
    return datasets.Dataset.from_dict(
        {"prompt": [c[-2]["content"] + "\n" for c in convs], "completion": [c[-1]["content"] for c in convs]}
    )


def hand_rendered(tokenizer, dataset, config) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each example rendered by itself, by hand: (ids, trained mask) with the EOS appended (virtual: ``eos_id``, its
    mask ``config.eos_trained``), from transformers' ``apply_chat_template`` or the tokenizer's own encoding."""
    out = []
    eos = tokenizer.eos_id
    for row in dataset:
        if config.completion_column is None:
            r = tokenizer._tok.apply_chat_template(
                row[config.column], tokenize=True, return_dict=True, return_assistant_tokens_mask=True
            )
            ids, mask = list(r["input_ids"]), np.asarray(r["assistant_masks"], dtype=bool)
            if config.policy == "all":
                mask[:] = True
            if config.policy == "last_turn":
                ones = np.flatnonzero(mask)
                start = ones[-1]
                while start > 0 and mask[start - 1]:
                    start -= 1
                mask[:start] = False
        else:
            prompt = tokenizer._tok(row[config.column], add_special_tokens=False)["input_ids"]
            ids = tokenizer._tok(row[config.column] + row[config.completion_column], add_special_tokens=False)[
                "input_ids"
            ]
            shared = next((i for i, (a, b) in enumerate(zip(ids, prompt)) if a != b), min(len(ids), len(prompt)))
            mask = np.arange(len(ids)) >= shared if config.policy == "completion" else np.ones(len(ids), bool)
        out.append((np.array(ids + [eos], dtype=np.int64), np.append(mask, config.eos_trained)))
    return out


def expected_sample(rendered, spans, i: int, seq_len: int, concat: bool, pad_id: int) -> dict[str, np.ndarray]:
    """Sample ``i``'s input ids, labels (-100 where not trained, at span ends and on padding) and loss mask, from the
    hand-rendered examples: the straightforward per-position form."""
    cells: list[tuple[int, bool, int]] = []  # (token, trained, span number)
    for j in range(spans.offsets[i], spans.offsets[i + 1]):
        ids, mask = rendered[spans.doc_ids[j]]
        cells += [(int(ids[p]), bool(mask[p]), j) for p in range(spans.starts[j], spans.stops[j])]
    width = seq_len + 1 if concat else seq_len
    cells += [(pad_id, False, -1)] * (width - len(cells))
    inputs = np.array([c[0] for c in cells[:seq_len]])
    labels = np.full(seq_len, -100)
    for p in range(seq_len):
        nxt = p + 1
        if nxt < len(cells) and cells[nxt][2] >= 0 and (concat or cells[nxt][2] == cells[p][2]) and cells[nxt][1]:
            labels[p] = cells[nxt][0]
    return {"input_ids": inputs, "labels": labels, "loss_mask": labels != -100}
