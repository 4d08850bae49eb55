"""A local chat corpus for supervised fine-tuning (``train/configs/sft.toml``, ``make demo-sft`` and the SFT tests):
nothing is downloaded.

    python -m train.chat_corpus [--out .cache/sft-chat] [--conversations 600] [--seed 0]

writes ``OUT/chat.jsonl`` (one ``{"messages": [{"role", "content"}, ...]}`` row a line) and ``OUT/tokenizer/``, a
400-piece byte-level BPE trained on this interpreter's ``os.py`` and saved as a ``transformers`` directory whose chat
template wraps each assistant turn in ``{% generation %}``: the index renders every conversation with it and stores the
loss mask of ``data.loss_policy`` (``assistant``: only what the assistant says is trained) beside the tokens.

Invariants: the same arguments write byte-identical files (the words, the conversations and the BPE training are
deterministic), so the index cache key and the data fingerprint of a rebuilt corpus are those of the first build. A
conversation is an optional system turn, then 1 to 3 user/assistant exchanges of 1 to 30 words each.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["CHAT_TEMPLATE", "conversations", "make_chat_tokenizer", "write_chat_corpus"]

CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'assistant' %}<|begin_of_text|>assistant\n"
    "{% generation %}{{ m['content'] }}<|endoftext|>{% endgeneration %}\n"
    "{% else %}<|begin_of_text|>{{ m['role'] }}\n{{ m['content'] }}<|endoftext|>\n{% endif %}{% endfor %}"
)
TOKENIZER_VOCAB_SIZE = 400


def _words() -> list[str]:
    """The first 3000 alphabetic words of this interpreter's ``os.py``: the vocabulary of every conversation."""
    text = Path(os.__file__).read_text()
    return [w for w in text.split() if w.isalpha()][:3000]


def make_chat_tokenizer(out_dir: str | Path, template: str = CHAT_TEMPLATE) -> Any:
    """A 400-piece BPE directory with ``template`` in its tokenizer_config.json, loaded as a TransformersTokenizer."""
    from detsampler.text.hf import TransformersTokenizer, train_hf_bpe

    words = _words()
    train_hf_bpe([" ".join(words[i : i + 50]) for i in range(0, len(words), 50)], TOKENIZER_VOCAB_SIZE, out_dir)
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


def write_chat_corpus(out_dir: str | Path, num_conversations: int = 600, seed: int = 0) -> tuple[Path, Path]:
    """Write ``OUT/chat.jsonl`` and ``OUT/tokenizer/`` (see the module doc); returns their paths. Files are written
    whole under a temporary name and renamed, so a reader never sees a partial file."""
    if isinstance(num_conversations, bool) or not isinstance(num_conversations, int) or num_conversations < 1:
        raise ValueError(f"num_conversations must be an integer >= 1, got {num_conversations!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer_dir = out / "tokenizer"
    make_chat_tokenizer(tokenizer_dir)
    corpus = out / "chat.jsonl"
    tmp = out / f".chat.jsonl.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.writelines(json.dumps({"messages": m}) + "\n" for m in conversations(num_conversations, seed))
    os.replace(tmp, corpus)
    return corpus, tokenizer_dir


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m train.chat_corpus", description=__doc__.split("\n")[0])
    p.add_argument("--out", default=".cache/sft-chat", help="directory of chat.jsonl and tokenizer/")
    p.add_argument("--conversations", type=int, default=600)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    corpus, tokenizer_dir = write_chat_corpus(args.out, args.conversations, args.seed)
    print(f"{args.conversations} conversations: {corpus}; tokenizer with a chat template: {tokenizer_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
