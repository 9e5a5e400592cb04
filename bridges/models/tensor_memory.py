"""Peak tensor memory of a piece of work, on any device: CUDA's allocator record, or on a CPU (which
keeps none) the bytes of live tensor storages counted as each op creates them.

Why a counter and not the process's resident size: RSS includes the interpreter, libraries and the
allocator's free lists, and never shrinks, so it cannot tell a linear decode loop from a quadratic
one. The counter sees exactly the tensors, the quantity a GPU's allocator would report, so the
memory benchmarks and tests read the same figure on the CPU as on a GPU.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveTensorBytes(TorchDispatchMode):
    """Bytes held by live tensor storages, and their peak, counted as ops create them (``track`` adds
    tensors that existed before). A storage is counted once and uncounted when it is freed."""

    def __init__(self) -> None:
        super().__init__()
        self._live: dict[int, Any] = {}
        self.current = self.peak = 0

    def track(self, tensors: Any) -> None:
        for tensor in tree_flatten(tensors)[0]:
            if isinstance(tensor, torch.Tensor):
                self._add(tensor.untyped_storage())

    def _add(self, storage: Any) -> None:
        key, size = id(storage), storage.nbytes()
        if key in self._live or size == 0:
            return
        self._live[key] = weakref.ref(storage, functools.partial(self._dropped, key, size))
        self.current += size
        self.peak = max(self.peak, self.current)

    def _dropped(self, key: int, size: int, _ref: Any) -> None:
        if self._live.pop(key, None) is not None:
            self.current -= size

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.track(out)
        return out


def peak_bytes(work: Callable[[], Any], existing: Any, device: torch.device) -> int:
    """Peak tensor bytes while ``work`` runs, counting the tensors in ``existing`` (weights, optimizer
    state) from the start: the allocator's peak on CUDA, ``LiveTensorBytes`` elsewhere."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        work()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device))
    tracker = LiveTensorBytes()
    tracker.track(existing)
    with tracker:
        work()
    return tracker.peak
