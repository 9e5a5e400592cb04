"""The policy the GRPO trainer trains and the engine that samples it.

Shared by the trainer and the rollout child process (``rollout_process``), which builds its own
copy of the policy: keeping it here lets both import it without importing each other. Both load
through ``bridges.models.hardware.load_causal_lm``, so the engine samples in the dtype the policy computes
in (``trainer.dtype``) and the first importance ratio of a run is 1.
"""

from __future__ import annotations

from typing import Any

import torch

from bridges.envs.types import TrainableEngine
from bridges.grpo.engine_shape import BatchShape, engine_rows, memory_budget
from bridges.models.fused import apply_kernels
from bridges.models.hardware import Placement, load_causal_lm
from bridges.models.recompute import apply_recompute, recompute_stride
from bridges.runs.engines import engine_class
from bridges.runs.train_config import TrainConfig, lora_config


def load_policy(
    config: TrainConfig, where: Placement, *, for_sampling: bool = False, weights_dtype: Any = None,
    adapter: bool = True,
) -> tuple[torch.nn.Module, Any]:
    """The trainable policy (optionally LoRA-wrapped) on ``where.device`` in ``where.dtype`` (or
    ``weights_dtype``: FSDP's fp32 sharded masters), and its tokenizer; activations recomputed as
    ``trainer.gradient_checkpointing`` says.

    ``for_sampling``: the engine's copy, the same module layout (so pushed tensors find their names) but
    frozen, in eval mode and without checkpointing. A copy whose weights require grad makes every
    forward outside inference mode record a graph; in the decode loop that graph holds each step's KV
    cache alive, memory quadratic in the length (19 GiB at 0.5B, 64 rows x 128 tokens).

    ``adapter=False``: no LoRA wrapper even when ``trainer.lora_rank`` asks for one (the in-process engine's
    copy, which merges the pushed factors into plain weights: ``HFEngine.merge_adapter``)."""
    from transformers import AutoTokenizer

    from bridges.models.tiny import resolve_model_path

    path = resolve_model_path(config.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    policy = load_causal_lm(path, where, weights_dtype=weights_dtype)
    if not for_sampling:  # off, every decoder layer or every k-th (bridges/models/recompute.py)
        apply_recompute(policy, recompute_stride(config.trainer.gradient_checkpointing))
        apply_kernels(policy, config.trainer.kernels)  # eager or compiled layers (bridges/models/fused.py)
    policy.config.use_cache = False  # the training forward runs over whole sequences
    lora = lora_config(config.trainer) if adapter else None
    if lora is not None:
        from bridges.runtime.errors import require_extra

        policy = require_extra("peft", "trl", "LoRA training").get_peft_model(policy, lora)
    if for_sampling:
        policy.requires_grad_(False).eval()
    return policy, tokenizer


def make_engine(
    config: TrainConfig, where: Placement, tokenizer: Any, shape: BatchShape, processes: int = 1,
    reserve_bytes: int = 0,
) -> Any:
    """The generation engine behind the client (``auto_engine`` says which for ``engine=auto``). Its
    weights start as the checkpoint's; the trainer pushes the policy's before the first
    rollout. ``shape``: the rows and tokens this process asks for at once (``engine_shape``), which size
    the engine's batches and the paged engine's cache. ``reserve_bytes``: what the trainer will still
    allocate on the GPU (the vLLM and paged caches leave it out)."""
    choice = config.engine
    if choice == "auto":
        choice = auto_engine(where.device.type == "cuda", processes)
    if choice == "vllm":
        return engine_class("vllm").for_training(config, where, tokenizer, reserve_bytes)
    # its own copy of the weights: training changes the policy in another thread while the engine
    # samples the next batch, and a batch must never see half-updated weights
    # a LoRA policy's engine holds plain weights: each push merges the adapter into them (merge_adapter)
    engine_model, _ = load_policy(config, where, for_sampling=True, adapter=False)
    dtype_bytes = where.dtype.itemsize
    rows = engine_rows(shape, engine_model.config, dtype_bytes, memory_budget(where.device, reserve_bytes),
                       config.trainer.group_size)
    options: dict[str, Any] = {"cuda_graphs": config.trainer.cuda_graphs}
    if choice == "paged":
        options.update(reserve_bytes=reserve_bytes,
                       cache_tokens=rows * shape.tokens_per_row if where.device.type == "cuda" else None)
    return engine_class(choice)(engine_model, tokenizer, device=where.device, max_batch_size=rows, **options)


def auto_engine(on_gpu: bool, processes: int) -> str:
    """``engine=auto``: vLLM on a GPU (one training process) where installed; else on a GPU the paged
    engine when a flash-attention kernel is installed, since transformers' continuous batching runs
    ``paged|sdpa`` without one, eagerly and without CUDA graphs (1,002 tokens/s on an H100 at Qwen2.5-0.5B,
    slower than the hf decode loop there); else the hf engine."""
    if on_gpu and processes == 1 and _installed("vllm"):
        return "vllm"
    return "paged" if on_gpu and _installed("flash_attn") else "hf"


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def trainable_names(policy: torch.nn.Module) -> set[str]:
    """What travels to the engine after a step: the trained tensors (the LoRA matrices for an adapter)."""
    return {n for n, p in policy.named_parameters() if p.requires_grad}


async def sync_weights(
    engine: TrainableEngine, state: dict[str, torch.Tensor], policy: torch.nn.Module
) -> None:
    """Push the policy's trained tensors (``state``, whole tensors by name) to the engine; its
    weight_version increments."""
    await engine.aupdate_weights(state, policy=policy)
