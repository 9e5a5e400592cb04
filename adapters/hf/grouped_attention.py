"""Attention for grouped key/value heads without repeating them, for the hf engine's fixed-shape decode.

Why: transformers' ``sdpa`` path repeats each key/value head ``heads / kv_heads`` times whenever a mask is
given (``repeat_kv``; only an unmasked call may use sdpa's own ``enable_gqa``), and the fixed-shape decode
always passes a mask. At Qwen2.5-0.5B (14 query heads, 2 key/value heads) that copies the whole static
cache seven times per layer per step: at 256 rows x 512 columns ~11 GB of memory traffic a step, more than
the step's own work. Here the query heads that share a key/value head become extra query positions of
that one head: ``query`` [B, H, Q, D] is read as [B, H_kv, rep x Q, D] (heads of a group are adjacent, as
``repeat_kv`` lays them out), the mask is repeated over the rep positions (a few bools a row), and one
sdpa call attends the cache as it is. Each query row's softmax is its own, so the result is sdpa's.

Registered with transformers' ``AttentionInterface`` as ``bridges_grouped_sdpa``; ``grouped`` switches a
model to it for the duration of a block (the engine's own copy, under its weight lock).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

NAME = "bridges_grouped_sdpa"


def grouped_sdpa(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                 **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: ``query`` [B, H, Q, D], ``key``/``value`` [B, H_kv, K, D],
    a 4-D boolean or additive mask [B, 1, Q, K]; returns the output as [B, Q, H, D] and no weights."""
    batch, heads, length, dim = query.shape
    rep = heads // key.shape[1]
    grouped_q = query.reshape(batch, key.shape[1], rep * length, dim)
    mask = attention_mask
    if mask is not None and rep > 1:
        mask = mask.unsqueeze(2).expand(-1, -1, rep, -1, -1).reshape(mask.shape[0], 1, rep * length, mask.shape[-1])
    out = torch.nn.functional.scaled_dot_product_attention(grouped_q, key, value, attn_mask=mask, dropout_p=dropout,
                                                           scale=scaling, is_causal=False)
    return out.reshape(batch, heads, length, dim).transpose(1, 2).contiguous(), None


def _register() -> None:
    from transformers import AttentionInterface

    if NAME not in AttentionInterface._global_mapping:
        AttentionInterface.register(NAME, grouped_sdpa)


def applies(model: Any) -> bool:
    """The model attends with sdpa over fewer key/value heads than query heads."""
    config = model.config
    heads = getattr(config, "num_attention_heads", 0)
    return config._attn_implementation == "sdpa" and 0 < getattr(config, "num_key_value_heads", heads) < heads


@contextmanager
def grouped(model: Any) -> Iterator[None]:
    """``model`` attends with ``grouped_sdpa`` inside the block (when it ``applies``), with sdpa again after."""
    if not applies(model):
        yield
        return
    _register()
    model.config._attn_implementation = NAME
    try:
        yield
    finally:
        model.config._attn_implementation = "sdpa"
