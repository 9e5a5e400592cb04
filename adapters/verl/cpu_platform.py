"""verl's trainer on a CPU: a platform verl can select, and the few patches it needs, applied in verl's
processes only (``bridges.adapters.verl.plugin`` calls ``enable`` when the launcher asked for CPU).

What each piece answers (the failures, in the order verl 0.9.1 meets them on a CPU):
- verl falls back to the nvidia platform when none is detected, then asks torch for NCCL: the
  ``cpu`` platform below says device "cpu", backend "gloo" (and the process group is created with
  plain "gloo": torch refuses verl's "cpu:gloo,cpu:gloo" as a duplicate), Ray resource "GPU" (the launcher declares logical GPUs to Ray so verl's resource check,
  which counts only GPU/NPU, passes), and ``current_device() == "cpu"`` for FSDP's ``device_id``;
- ``torch.cuda``-style calls verl makes (memory stats, rng state, empty_cache) go to a small device
  module with CPU answers;
- the FSDP engine is registered for cuda/npu only: ``VERL_ENGINE_DEVICE=cuda`` selects it (it runs on
  whatever device the platform names);
- the reference model is offloaded with ``CPUOffloadPolicy(pin_memory=True)``, and pinning needs an
  accelerator: offload policies are made unpinned.
Nothing here edits verl's installed files; on a GPU none of it is loaded.
"""

from __future__ import annotations

import contextlib
import os
import types
from typing import TYPE_CHECKING, Any

import torch

from bridges.runtime.errors import require_extra

if TYPE_CHECKING:
    from verl.plugin.platform.platform_base import PlatformBase
else:
    PlatformBase = require_extra("verl.plugin.platform.platform_base", "verl", "verl on a CPU").PlatformBase


def _zero(*_: Any, **__: Any) -> int:
    return 0


def _nothing(*_: Any, **__: Any) -> None:
    return None


class _CPUDeviceModule(types.ModuleType):
    """What verl calls on ``get_torch_device()`` (a ``torch.cuda`` stand-in), answered for a CPU."""

    def __init__(self) -> None:
        super().__init__("bridges_cpu_device")
        for name in ("memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved"):
            setattr(self, name, _zero)
        for name in ("empty_cache", "reset_peak_memory_stats", "set_device", "synchronize", "ipc_collect"):
            setattr(self, name, _nothing)
        self.manual_seed = self.manual_seed_all = torch.manual_seed
        self.get_rng_state, self.set_rng_state = torch.get_rng_state, torch.set_rng_state

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def current_device(self) -> str:
        return "cpu"

    def mem_get_info(self, *_: Any) -> tuple[int, int]:
        pages, size = os.sysconf("SC_AVPHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        return pages * size, os.sysconf("SC_PHYS_PAGES") * size

    def memory_stats(self, *_: Any) -> dict[str, int]:
        return {}

    def get_device_name(self, *_: Any) -> str:
        return "CPU"

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)


class PlatformCPU(PlatformBase):
    """``VERL_PLATFORM=cpu``."""

    device_module = _CPUDeviceModule()

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    def is_available(self) -> bool:
        return True

    def current_device(self) -> Any:
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None: ...

    def synchronize(self, device_index: int | None = None) -> None: ...

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None: ...

    def empty_cache(self) -> None: ...

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str) -> Any:
        yield

    def profiler_start(self) -> None: ...

    def profiler_stop(self) -> None: ...

    def ray_resource_name(self) -> str:
        return "GPU"  # logical GPUs declared to Ray by the launcher stand for CPU worker slots

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def _unpinned_offload() -> None:
    """Offload policies without pinned memory (pinning needs an accelerator). Must run before verl's
    FSDP engine module imports the class, which the plugin guarantees by running inside ``import verl``."""
    import torch.distributed.fsdp as fsdp

    pinned = fsdp.CPUOffloadPolicy
    if getattr(pinned, "bridges_unpinned", False):
        return

    class UnpinnedOffload(pinned):  # type: ignore[misc, valid-type]
        bridges_unpinned = True

        def __init__(self, pin_memory: bool = False) -> None:
            super().__init__(pin_memory=False)

    fsdp.CPUOffloadPolicy = UnpinnedOffload  # type: ignore[misc]


def _gloo_process_group() -> None:
    """verl builds the backend string ``cpu:gloo,<device>:<backend>``, which on a CPU names the cpu
    device twice (torch refuses it): plain ``gloo``. Patched before verl's workers import the function."""
    from verl.utils import distributed

    original = distributed.initialize_global_process_group_ray
    if getattr(original, "bridges_gloo", False):
        return

    def initialize(timeout_second: Any = None, backend: Any = None) -> Any:
        return original(timeout_second=timeout_second, backend=backend or "gloo")

    initialize.bridges_gloo = True  # type: ignore[attr-defined]
    distributed.initialize_global_process_group_ray = initialize


def enable() -> None:
    """Select the CPU platform and apply the patches, in this (verl) process."""
    from verl.plugin.platform.platform_manager import PlatformRegistry

    PlatformRegistry.register("cpu")(PlatformCPU)
    os.environ["VERL_PLATFORM"] = "cpu"
    os.environ.setdefault("VERL_ENGINE_DEVICE", "cuda")
    _unpinned_offload()
    _gloo_process_group()
