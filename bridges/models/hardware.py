"""Where a model runs and in what precision: one decision for every command and backend.

``device``: ``auto`` (the process's CUDA device when one is visible — ``cuda:LOCAL_RANK`` under a
multi-process launch — else the CPU), ``cpu``, ``cuda`` or ``cuda:N``. ``dtype``: ``auto`` (bf16 on a
CUDA device that supports it, fp32 otherwise; bf16 matmuls are slow on most CPUs), ``bf16``, ``fp16``
or ``fp32``. The attention implementation follows from both: flash-attention 2 on CUDA in half
precision when it is installed, else PyTorch's ``sdpa``.

``load_causal_lm`` is the one place a checkpoint becomes a model on a device (the GRPO policy and its
engine, ``bridges.eval``/``bridges.serve``'s hf engine, the local Tinker server, TRL and SFT), so the
five callers cannot drift into five dtype rules.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from bridges.runtime.errors import ConfigError

T = TypeVar("T")
DEVICE_HELP = "auto (CUDA when visible, else CPU) | cpu | cuda | cuda:N"
DTYPES = ("auto", "bf16", "fp16", "fp32")
DTYPE_HELP = "auto (bf16 on a CUDA device that supports it, else fp32) | bf16 | fp16 | fp32"


@dataclass(frozen=True)
class Placement:
    """A resolved ``device``/``dtype`` pair and the attention implementation that goes with them."""

    device: Any  # torch.device
    dtype: Any  # torch.dtype: the dtype the model computes in (its weights, for the hf engine)
    attn_implementation: str

    @property
    def is_half(self) -> bool:
        import torch

        return self.dtype in (torch.bfloat16, torch.float16)


def check_device(name: str, key: str = "device") -> None:
    """A device name this machine can use, or one sentence saying why not (before anything loads)."""
    import torch

    if name in ("auto", "cpu"):
        return
    kind, _, index = name.partition(":")
    if kind != "cuda" or (index and not index.isdigit()):
        raise ConfigError(f"{key}={name} is not a device; use {DEVICE_HELP}.")
    if not torch.cuda.is_available():
        raise ConfigError(f"{key}={name} but no CUDA device is visible here; use {key}=auto or {key}=cpu.")
    if index and int(index) >= torch.cuda.device_count():
        raise ConfigError(
            f"{key}={name} but only {torch.cuda.device_count()} CUDA device(s) are visible (cuda:0 to "
            f"cuda:{torch.cuda.device_count() - 1})."
        )


def check_process_devices(name: str, processes: int, key: str = "trainer.device") -> None:
    """Several processes on CUDA take one GPU each: there must be as many."""
    import torch

    if processes < 2 or name == "cpu" or not torch.cuda.is_available():
        return
    if torch.cuda.device_count() < processes:
        raise ConfigError(
            f"{processes} processes need a GPU each but {torch.cuda.device_count()} are visible; lower the number "
            f"of processes, or set {key}=cpu."
        )


def resolve_device(name: str = "auto") -> Any:
    """``name`` as a ``torch.device`` (``check_device`` has accepted it). ``auto`` and ``cuda`` take this
    process's own GPU (``LOCAL_RANK`` under a multi-process launch)."""
    import torch

    own_gpu = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}")
    if name == "cuda":
        return own_gpu
    if name != "auto":
        return torch.device(name)
    return own_gpu if torch.cuda.is_available() else torch.device("cpu")


def resolve_dtype(name: str, device: Any) -> Any:
    import torch

    if name == "auto":
        bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
        return torch.bfloat16 if bf16 else torch.float32
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def attention_implementation(device: Any, dtype: Any) -> str:
    """flash-attention 2 where it runs (CUDA, half precision, installed), else PyTorch's fused sdpa."""
    import torch

    half = dtype in (torch.bfloat16, torch.float16)
    if device.type == "cuda" and half and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    return "sdpa"


def placement(device: str = "auto", dtype: str = "auto") -> Placement:
    """The device, dtype and attention implementation for ``device``/``dtype`` settings."""
    resolved = resolve_device(device)
    precision = resolve_dtype(dtype, resolved)
    return Placement(resolved, precision, attention_implementation(resolved, precision))


def load_causal_lm(path: str, where: Placement, *, weights_dtype: Any = None) -> Any:
    """A ``AutoModelForCausalLM`` from ``path`` on ``where.device``, its weights in ``where.dtype`` (or
    ``weights_dtype``: a trainer that keeps fp32 weights and computes under autocast), with the
    attention implementation ``where`` chose. Loaded through the ordinary ``from_pretrained`` path."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=weights_dtype or where.dtype, attn_implementation=where.attn_implementation
    )
    return model.to(where.device)


def memory_metrics(device: Any) -> dict[str, float]:
    """The accelerator's memory since the last call, for the step's metrics row: what stays allocated
    (weights, optimizer state, caches) and the peak on top of it (activations, logits, the engine's
    batch). The peak is reset here, so each row holds its own step's. Empty on a CPU, whose allocator
    keeps no such record."""
    import torch

    if device.type != "cuda":
        return {}
    gib = 1024**3
    metrics = {
        "memory/allocated_gb": torch.cuda.memory_allocated(device) / gib,
        "memory/peak_gb": torch.cuda.max_memory_allocated(device) / gib,
    }
    torch.cuda.reset_peak_memory_stats(device)
    return metrics


# --------------------------------------------------------------------------------------------------
# One device per process, in every thread

_thread = threading.local()


def bind_thread(device: Any) -> None:
    """Make ``device`` this thread's current device. CUDA's current device is per thread and a new
    thread starts on cuda:0, so every thread that touches CUDA calls this first: FSDP2 makes its
    streams on the current device and a collective without a device argument runs there, so on ranks
    >= 1 an unbound worker thread would put them on another process's GPU. Recorded for any device,
    so the rule is checked on a CPU (``thread_device``)."""
    if device is not None and device.type == "cuda":
        import torch

        torch.cuda.set_device(device)
    _thread.device = device


def thread_device() -> Any:
    """The device this thread was bound to (``bind_thread``), or None."""
    return getattr(_thread, "device", None)


def bound(device: Any, func: Callable[..., T]) -> Callable[..., T]:
    """``func`` as a callable that binds its thread to ``device`` first: what every
    ``asyncio.to_thread`` of the trainer and its engine runs (``tests/grpo/test_devices.py``)."""

    @functools.wraps(func)
    def call(*args: Any, **kwargs: Any) -> T:
        bind_thread(device)
        return func(*args, **kwargs)

    return call
