"""Starting transformers' continuous-batching manager for ``PagedEngine``, and reading its results.

Kept apart from the engine's scheduling so the one place that speaks transformers' continuous-batching
API (``GenerationConfig`` + ``ContinuousBatchingConfig`` -> ``init_continuous_batching``) is short
and easy to compare with transformers' own documentation when its API moves.
"""

from __future__ import annotations

import math
from typing import Any

from bridges.adapters.hf.decode import _stop_string_hit
from bridges.envs.types import Sample

CPU_CACHE_TOKENS = 32_768  # the KV cache on the CPU, in tokens (transformers would size it from free RAM)
CPU_BLOCK_SIZE = 32  # small blocks on the CPU: a group's shared prompt fills whole blocks sooner
CPU_BATCH_TOKENS = 4_096  # tokens one CPU forward step takes at most
GPU_BLOCK_SIZE = 256  # transformers' own default block, when the cache is sized in tokens
MIN_CACHE_SHARE = 0.05  # of the GPU's free memory, whatever the trainer reserves
# at most half the free memory: the trainer's activations and logits chunks are not in reserve_bytes
# (on one H100 at Qwen2.5-0.5B a 0.9 share left the run at 72 GB of 80)
MAX_CACHE_SHARE = 0.5


def start_manager(engine: Any, warpers: Any) -> Any:
    """A started manager on ``engine.model`` that runs ``warpers`` (a ``paged_engine.WarperSet``):
    greedy (argmax), or sampling with per-request temperature and, when the set says so, top-k/top-p.
    Logprobs of the sampled ids come back with every row."""
    from transformers import GenerationConfig

    sampling = not warpers.greedy
    generation = GenerationConfig(
        do_sample=sampling,
        # a warper runs per request only if the manager's config turns it on: these values are the
        # defaults no request uses (every request passes its own temperature, top_k, top_p)
        temperature=0.5 if sampling else None,
        top_k=50 if sampling and warpers.top_k else None,
        top_p=0.5 if sampling and warpers.top_p else None,
        eos_token_id=sorted(engine.eos_token_ids) or -1,
        max_new_tokens=engine.max_model_len,
    )
    manager = engine.model.init_continuous_batching(
        generation_config=generation, continuous_batching_config=_cache_config(engine)
    )
    manager.start()
    return manager


def _cache_config(engine: Any) -> Any:
    """The paged cache's size: on the CPU a fixed number of tokens (transformers would take a share of
    the machine's RAM); on a GPU a share of the free memory that leaves the trainer what it reserved."""
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    options: dict[str, Any] = {"return_logprobs": True, "per_request_processors": True}
    if engine.block_size is not None:
        options["block_size"] = engine.block_size
    if engine.device.type == "cuda":  # asked for: transformers would leave them off under paged|sdpa
        options["use_cuda_graph"] = engine.cuda_graphs
    if engine.device.type == "cpu":
        block = engine.block_size or CPU_BLOCK_SIZE
        tokens = engine.cache_tokens or CPU_CACHE_TOKENS
        options.update(
            block_size=block,
            num_blocks=blocks_for(tokens, block, engine.max_batch_size),
            max_batch_tokens=min(tokens, CPU_BATCH_TOKENS),
        )
    elif engine.cache_tokens is not None:
        block = engine.block_size or GPU_BLOCK_SIZE
        options.update(num_blocks=blocks_for(engine.cache_tokens, block, engine.max_batch_size))
    elif engine.device.type == "cuda":
        options["max_memory_percent"] = cache_share(engine.device, engine.reserve_bytes)
    return ContinuousBatchingConfig(**options)


def blocks_for(tokens: int, block: int, rows: int) -> int:
    """Blocks that hold ``tokens`` when up to ``rows`` rows each leave their last block part-filled.
    Without the extra block per row, a cache sized to a burst's tokens holds fewer blocks than the burst
    has rows (64 rows of ~100 tokens in 256-token blocks: 25 blocks), and the rows run a few at a time."""
    return math.ceil(tokens / block) + rows


def cache_share(device: Any, reserve_bytes: int) -> float:
    """The share of the GPU's free memory the cache may take once ``reserve_bytes`` are set aside."""
    import torch

    free, _ = torch.cuda.mem_get_info(device)
    if free <= 0:
        return MIN_CACHE_SHARE
    share = (free - reserve_bytes) / free * MAX_CACHE_SHARE
    return min(MAX_CACHE_SHARE, max(MIN_CACHE_SHARE, share))


def to_sample(engine: Any, row: Any, output: Any, version: int) -> Sample:
    """One finished row as a ``Sample``: the finish reason from its last id, cut at the first stop string."""
    token_ids, logprobs = list(output.generated_tokens), list(output.logprobs)
    finish = "stop" if token_ids and token_ids[-1] in row.stop_token_ids else "length"
    stop_str = None
    if row.params.stop:
        window = max(map(len, row.params.stop)) + 8
        for end in range(1, len(token_ids) + 1):
            hit = _stop_string_hit(engine.tokenizer, token_ids[:end], row.params.stop, window)
            if hit is not None:
                token_ids, logprobs, finish, stop_str = token_ids[:end], logprobs[:end], "stop", hit
                break
    return Sample(token_ids, logprobs, finish, version, stop_str)  # type: ignore[arg-type]
