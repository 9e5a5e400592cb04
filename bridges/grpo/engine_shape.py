"""How many rows the trainer's engine decodes at once, and the KV cache they need: from the run's own
batch shape, bounded by an estimate of the memory they take.

Why from the batch: a step's rollouts (batch x group, and the batches generated ahead of it) arrive
together, and a decode step's host cost is nearly flat from 64 to 256 rows, so capping a batch at 64
(as the engine once did) ran the default 16 x 16 as four batches one after another. Why bounded: each
row holds its KV cache (layers x 2 x kv heads x head dim per token) and one step's logits in fp32
(a vocabulary per row, a few copies while sampling), which at Qwen's 151,936-word vocabulary is
~2.4 MB a row before the cache. The paged engine's cache is sized the same way on a GPU: blocks for
the rows x tokens this run can hold at once, not a share of whatever memory is free.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from bridges.runs.train_config import TrainConfig, batches_ahead, completion_budget

LOGIT_COPIES = 4  # fp32 logits, their log-softmax, the cumulative distribution, a top-k/top-p sort
GPU_SHARE = 0.5  # of what the trainer leaves free on the GPU (its activations come and go)
CPU_SHARE = 0.25  # of the machine's memory
PROMPTS_SAMPLED = 64  # training rows rendered to estimate the longest prompt


@dataclass(frozen=True)
class BatchShape:
    """What one training process asks its engine for at most: rows at once, and tokens per row."""

    rows: int
    prompt_tokens: int
    completion_tokens: int

    @property
    def tokens_per_row(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def batch_shape(config: TrainConfig, env: Any, tokenizer: Any, processes: int) -> BatchShape:
    """This process's share of a step's rollouts and those generated ahead of it (never more than the
    rollouts allowed in flight), the longest of the first training prompts, and the completion budget."""
    t = config.trainer
    groups = math.ceil(t.batch_size / processes)
    rows = min(groups * t.group_size * (batches_ahead(config) + 1), t.max_concurrent)
    return BatchShape(max(rows, 1), longest_prompt(env, tokenizer), completion_budget(config, env))


def longest_prompt(env: Any, tokenizer: Any, rows: int = PROMPTS_SAMPLED) -> int:
    """The longest rendered prompt of the first ``rows`` training rows (with the environment's tools),
    plus what its rollouts add to a prompt (``prompt_overhead_tokens``)."""
    from bridges.client.rendering import ChatRenderer
    from bridges.envs.base import build_prompt

    renderer, dataset = ChatRenderer(tokenizer), env.get_dataset()
    tools = getattr(env, "tool_defs", None) or None
    longest = 1
    for index in range(min(rows, len(dataset))):
        longest = max(longest, len(renderer.render_ids(build_prompt(dataset[index]), tools)))
    return longest + int(getattr(env, "prompt_overhead_tokens", 0) or 0)


def kv_bytes_per_token(model_config: Any, dtype_bytes: int) -> int:
    """Keys and values of one token over every layer."""
    heads = getattr(model_config, "num_attention_heads", 1)
    kv_heads = getattr(model_config, "num_key_value_heads", None) or heads
    head_dim = getattr(model_config, "head_dim", None) or model_config.hidden_size // heads
    return 2 * model_config.num_hidden_layers * kv_heads * head_dim * dtype_bytes


def row_bytes(model_config: Any, dtype_bytes: int, tokens: int) -> int:
    """One row's KV cache at ``tokens`` tokens and its share of a step's logits."""
    return kv_bytes_per_token(model_config, dtype_bytes) * tokens + LOGIT_COPIES * 4 * model_config.vocab_size


def memory_budget(device: Any, reserve_bytes: int) -> int:
    """Bytes the engine's rows may take: on a GPU a share of what is free once the trainer's
    ``reserve_bytes`` are set aside, on the CPU a share of the machine's memory."""
    if device.type == "cuda":
        import torch

        free, _ = torch.cuda.mem_get_info(device)
        return int(max(free - reserve_bytes, 0) * GPU_SHARE)
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * CPU_SHARE)


def engine_rows(shape: BatchShape, model_config: Any, dtype_bytes: int, budget_bytes: int, group_size: int) -> int:
    """The rows the engine decodes at once: the batch's, or as many as the budget holds, but never
    fewer than one group (a group shares a prompt; splitting it buys nothing) or 8."""
    fits = budget_bytes // max(row_bytes(model_config, dtype_bytes, shape.tokens_per_row), 1)
    return max(min(shape.rows, fits), min(shape.rows, max(group_size, 8)))
