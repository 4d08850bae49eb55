"""A small Llama-style decoder in plain torch: RMSNorm, rotary embeddings, SwiGLU, causal scaled-dot-product attention.

Rotary angles come from the batch's ``position_ids`` (restarting per document when the dataset says so). When
``document_ids`` is given, attention is block-diagonal causal: a token attends only to earlier tokens of the same
document
(``document``/``bestfit`` layouts), so packing never leaks one document into another. Without it, attention is plainly
causal over the whole sample (``concat``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from train.config import ModelConfig

__all__ = ["Block", "Transformer", "document_causal_mask", "rotary_tables"]


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in float32."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return y.type_as(x) * self.weight


def rotary_tables(position_ids: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of shape [batch, 1, seq, head_dim // 2] for integer ``position_ids`` [batch, seq]."""
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, device=position_ids.device, dtype=torch.float32) / head_dim)
    )
    angles = position_ids.to(torch.float32)[:, None, :, None] * inv_freq
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[..., :d/2], x[..., d/2:]) of ``x`` [batch, heads, seq, head_dim] by the tabled angles."""
    x1, x2 = x.float().chunk(2, dim=-1)
    out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    return out.type_as(x)


def document_causal_mask(document_ids: torch.Tensor) -> torch.Tensor:
    """Boolean mask [batch, 1, seq, seq]: True where query i may attend key j (j <= i, same document).

    The diagonal is always allowed so that no row is empty (padding rows then attend to themselves; their labels are
    ignored).
    """
    seq = document_ids.shape[-1]
    same = document_ids[:, :, None] == document_ids[:, None, :]
    causal = torch.ones(seq, seq, dtype=torch.bool, device=document_ids.device).tril()
    eye = torch.eye(seq, dtype=torch.bool, device=document_ids.device)
    return ((same & causal) | eye)[:, None]


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv = config.n_heads, config.kv_heads
        self.head_dim = config.dim // config.n_heads
        self.wq = nn.Linear(config.dim, config.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(config.dim, self.n_kv * self.head_dim, bias=False)
        self.wv = nn.Linear(config.dim, self.n_kv * self.head_dim, bias=False)
        self.wo = nn.Linear(config.n_heads * self.head_dim, config.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if self.n_kv != self.n_heads:
            repeat = self.n_heads // self.n_kv
            k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        if mask is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.wo(out.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(config.dim, config.hidden_dim, bias=False)
        self.w3 = nn.Linear(config.dim, config.hidden_dim, bias=False)
        self.w2 = nn.Linear(config.hidden_dim, config.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then x + ffn(norm(x)). The unit FSDP shards."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(config.dim, config.norm_eps)
        self.attention = Attention(config)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps)
        self.feed_forward = FeedForward(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin, mask)
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    """Token embedding, ``n_layers`` blocks, final RMSNorm and output projection to logits."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if config.vocab_size < 1:
            raise ValueError(
                f"ModelConfig.vocab_size must be set (>= 1) before building the model, got {config.vocab_size}"
            )
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.output = nn.Linear(config.dim, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Normal(0, init_std) weights; output projections of each block scaled by 1/sqrt(2 * n_layers)."""
        std = self.config.init_std
        for name, p in self.named_parameters():
            if p.ndim == 1:
                nn.init.ones_(p)
            elif name.endswith(("wo.weight", "w2.weight")):
                nn.init.normal_(p, mean=0.0, std=std / math.sqrt(2 * self.config.n_layers))
            else:
                nn.init.normal_(p, mean=0.0, std=std)

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        document_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits [batch, seq, vocab] for ``input_ids`` [batch, seq]."""
        b, t = input_ids.shape
        if position_ids is None:
            position_ids = torch.arange(t, device=input_ids.device).expand(b, t)
        head_dim = self.config.dim // self.config.n_heads
        cos, sin = rotary_tables(position_ids, head_dim, self.config.rope_theta)
        mask = None if document_ids is None else document_causal_mask(document_ids)
        x = self.tok_embeddings(input_ids)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.output(self.norm(x))
