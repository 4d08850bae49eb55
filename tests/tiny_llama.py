"""The tiny Llama (``transformers``' ``LlamaForCausalLM`` from a config, random weights) that the integration tests and
benchmarks train: one definition, its shape the smallest that runs every code path (2 heads, grouped-query off)."""

from __future__ import annotations

from typing import Any


def tiny_llama(vocab_size: int, *, hidden_size: int = 16, num_hidden_layers: int = 1, seed: int | None = None,
               **config: Any):  # fmt: skip
    """A ``LlamaForCausalLM`` of ``vocab_size`` tokens, ``hidden_size`` wide (MLP twice that), 2 attention heads;
    ``config`` adds ``LlamaConfig`` fields (``max_position_embeddings``, ``attn_implementation``...). ``seed``: the
    torch seed its weights are drawn with (None: the current generator)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if seed is not None:
        torch.manual_seed(seed)
    shape = dict(hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=num_hidden_layers)
    heads = dict(num_attention_heads=2, num_key_value_heads=2)
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab_size, **shape, **heads, **config))
