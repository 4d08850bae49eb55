"""A local chat corpus and tokenizer for the SFT tests: a byte-level BPE trained on standard-library text, saved as a
``transformers`` directory whose chat template marks assistant turns with ``{% generation %}``; conversations built
with ``datasets.Dataset.from_dict``. Nothing is downloaded. The tokenizer and the conversations are the trainer's
(``train/chat_corpus.py``: ``train/configs/sft.toml`` trains on the same kind of data)."""

from __future__ import annotations

import numpy as np

from train.chat_corpus import CHAT_TEMPLATE, conversations, make_chat_tokenizer

__all__ = [
    "CHAT_TEMPLATE",
    "PLAIN_TEMPLATE",
    "chat_dataset",
    "conversations",
    "crossing_labels",
    "expected_sample",
    "hand_rendered",
    "make_chat_tokenizer",
    "prompt_dataset",
    "with_empty_prompts",
]

# the same turns without the markers: what policy="all" accepts and "assistant" refuses
PLAIN_TEMPLATE = CHAT_TEMPLATE.replace("{% generation %}", "").replace("{% endgeneration %}", "")


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
        # no label crosses from one example into the next, concat included
        if nxt < len(cells) and cells[nxt][2] >= 0 and cells[nxt][2] == cells[p][2] and cells[nxt][1]:
            labels[p] = cells[nxt][0]
    return {"input_ids": inputs, "labels": labels, "loss_mask": labels != -100}


def crossing_labels(spans, sample_len: int, loss_mask: np.ndarray) -> int:
    """How many labels ``loss_mask`` (``[B, seq_len]``, True where the label of a position is trained; ``spans``: the
    layout's spans of the B samples, each ``sample_len`` cells wide) keeps whose position and target (the next cell)
    lie in different spans or in padding: labels that cross from one example into the next."""
    num_samples, seq_len = loss_mask.shape
    span_of = np.full((num_samples, sample_len + 1), -1)
    for i in range(num_samples):
        col = 0
        for j in range(spans.offsets[i], spans.offsets[i + 1]):
            n = int(spans.stops[j] - spans.starts[j])
            span_of[i, col : col + n] = j
            col += n
    crossing = (span_of[:, :seq_len] != span_of[:, 1 : seq_len + 1]) | (span_of[:, :seq_len] < 0)
    return int((np.asarray(loss_mask, dtype=bool) & crossing).sum())


def with_empty_prompts(dataset, every: int = 4):
    """``dataset`` (prompt/completion rows) with every ``every``-th prompt empty: its completion is trained from its
    first token on."""
    return dataset.map(lambda row, i: {"prompt": "" if i % every == 0 else row["prompt"]}, with_indices=True)
