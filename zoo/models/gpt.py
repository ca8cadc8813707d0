"""A small GPT-style decoder for token data (nanoGPT's layout and parameter names).

Pre-LayerNorm blocks of causal self-attention (``scaled_dot_product_attention``
with ``is_causal=True``, so flash or memory-efficient kernels are used where the
device has them) and a 4x MLP; learned position embeddings; the output head
shares its weight with the token embedding. Input ``[B, T]`` int64 tokens,
output ``[B, T, vocab]`` logits.

The repeated block's class is :class:`Block`: that is the name to give
``activation_checkpointing.block_types``.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.head_width = width // heads
        # Query, key and value in one matmul, laid out head by head ([q k v] of head 0, then
        # of head 1...): a column split for tensor parallelism keeps whole heads together.
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)
        self.dropout = dropout
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x):
        b, t = x.shape[:2]
        # -1: the heads this process holds (all of them, or its share under tensor parallelism)
        qkv = self.c_attn(x).view(b, t, -1, 3, self.head_width).transpose(1, 2)
        q, k, v = qkv.unbind(dim=3)
        dropout = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(b, t, -1)))


class MLP(nn.Module):
    def __init__(self, width: int, dropout: float) -> None:
        super().__init__()
        self.c_fc = nn.Linear(width, 4 * width)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * width, width)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    """One transformer layer: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads, dropout)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = MLP(width, dropout)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(
        self, vocab_size: int, context: int, layers: int, heads: int, width: int, dropout=0.0
    ) -> None:
        super().__init__()
        self.context = context
        self.transformer = nn.ModuleDict(
            {
                "wte": nn.Embedding(vocab_size, width),
                "wpe": nn.Embedding(context, width),
                "drop": nn.Dropout(dropout),
                "h": nn.ModuleList(Block(width, heads, dropout) for _ in range(layers)),
                "ln_f": nn.LayerNorm(width),
            }
        )
        self.lm_head = nn.Linear(width, vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied: one matrix, two uses
        self.apply(_init_weights)
        for name, p in self.named_parameters():  # GPT-2: scale residual projections by depth
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * layers))

    def forward(self, idx):
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)
