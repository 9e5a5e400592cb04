"""What the trainer's optimizer step holds at its peak, from its own tensors and the run's batch shape:
the floor ``benchmarks/trainer_memory.py`` measures every precision and adapter against, and the part
of it an engine started beside the trainer must leave free.

Why: an engine sized from "what is free now" (vLLM's ``gpu_memory_utilization``, the paged cache)
takes memory the step has not allocated yet. Once, the reserve was AdamW's moments + 2 GiB, while a full
bf16 step peaks at ~19 bytes a parameter: at Qwen2.5-0.5B on 80 GB the trainer kept ~5.5 of the ~8-9 GB
it needed. The floor counts what a step cannot avoid holding at once: weights, their gradients, fp32
masters where the weights are half, AdamW's two fp32 moments, the activations the recomputation
setting keeps, and one chunk of fp32 logits. Measured peaks are 1.07-1.18x it (``docs/guide/scaling.md``),
so the estimate is the floor x ``PEAK_OVER_FLOOR``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

PEAK_OVER_FLOOR = 1.2  # the worst measured peak / floor is 1.182 (full bf16, CPU), 1.129 on an H100
FULL_LAYER_ACTIVATION = 17  # hidden-sized tensors one decoder layer keeps per token without recomputation
# (34 x hidden bytes in half precision: Korthikanti et al. 2022 without the attention scores sdpa never stores)


def activation_bytes(model_config: Any, tokens: int, compute_bytes: int, stride: int) -> int:
    """The activations one micro-batch of ``tokens`` keeps for its backward: every layer's at recompute
    stride 0 (off); the layer inputs at stride 1, plus one layer's while it is recomputed; every K-th
    layer recomputed at stride K."""
    layers, hidden = model_config.num_hidden_layers, model_config.hidden_size
    per_layer = FULL_LAYER_ACTIVATION * hidden * tokens * compute_bytes
    if stride == 0:
        return layers * per_layer
    recomputed = layers // stride
    inputs = (recomputed + 1) * hidden * tokens * compute_bytes
    return inputs + (layers - recomputed) * per_layer + per_layer


def step_floor_bytes(policy: torch.nn.Module, master_params: list[torch.Tensor], masters: int, *,
                     tokens: int, chunk_tokens: int, compute_bytes: int, stride: int,
                     loss_tokens: int | None = None) -> int:
    """The floor of one step over a micro-batch of ``tokens`` (``loss_tokens`` of them scored; all when
    not given): weights, gradients, ``masters`` bytes of fp32 master copies, AdamW's moments over
    ``master_params``, activations, one chunk of fp32 logits."""
    weights = sum(p.numel() * p.element_size() for p in policy.parameters())
    grads = sum(p.numel() * p.element_size() for p in policy.parameters() if p.requires_grad)
    moments = 8 * sum(p.numel() for p in master_params)
    config: Any = policy.config
    logits = min(chunk_tokens, tokens if loss_tokens is None else loss_tokens) * int(config.vocab_size) * 4
    return int(weights + grads + masters + moments + activation_bytes(config, tokens, compute_bytes, stride) + logits)


def micro_batch_tokens(config: Any, tokens_per_row: int, processes: int) -> int:
    """The tokens one of this process's micro-batches runs through the model: ``trainer.micro_batch_tokens``
    when packing, else its share of a step's rows (``grad_accum_steps`` micro-batches) at full length."""
    t = config.trainer
    if t.micro_batch_tokens:
        return int(t.micro_batch_tokens)
    rows = math.ceil(t.batch_size / processes) * t.group_size
    return math.ceil(rows / t.grad_accum_steps) * tokens_per_row


def step_reserve_bytes(ctx: Any, config: Any, compute_dtype: torch.dtype, tokens_per_row: int, processes: int) -> int:
    """What the step will still allocate beyond what exists now (the weights and masters are resident
    when the engine is made): the estimated peak less the resident bytes. ``ctx``: the trainer's
    ``StepContext``."""
    from bridges.models.recompute import recompute_stride

    master = ctx.master
    masters = sum(m.numel() * 4 for _, _, m in master.pairs)
    compute_bytes = compute_dtype.itemsize
    floor = step_floor_bytes(ctx.policy, master.params, masters,
                             tokens=micro_batch_tokens(config, tokens_per_row, processes),
                             chunk_tokens=ctx.logprob_chunk_tokens, compute_bytes=compute_bytes,
                             stride=recompute_stride(config.trainer.gradient_checkpointing))
    resident = sum(p.numel() * p.element_size() for p in ctx.policy.parameters()) + masters
    return max(int(floor * PEAK_OVER_FLOOR) - resident, 0)
