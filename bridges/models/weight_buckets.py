"""Weights from a trainer to an engine in another process on the same node, without a host round trip:
one shared byte buffer, filled a bucket at a time, read in place by the receiver. Used by verl's hf
rollout (a replica's leader worker to its server) and by the vLLM engine (the trainer to vLLM's workers).

Why: the object-store path (verl) or a pickled ``collective_rpc`` argument (vLLM) copies every tensor
from the GPU to host memory, through the pipe, and back to the GPU each step: two host copies of the
whole model per step (1-3 GB at 0.5-1.5B, through pageable memory). Sender and receiver share a node
and here a GPU (``hf_rollout.HFReplica``; vLLM's workers beside the trainer), so the bytes need not leave
the device at all:
- on a GPU the buffer is CUDA memory shared by an IPC handle (``torch.multiprocessing.reductions``). The
  handle names the device by its index in the sender's view; the server sees the node's GPUs in another
  order, so the index is re-mapped through the device's UUID (``cuda_index_of``);
- on the CPU (verl's CPU mode, and the tests) the buffer is POSIX shared memory. Everything else (packing,
  alignment, buckets, growing for a tensor larger than a bucket, the server's checks) is the same code.

Invariant: the sender never writes the buffer while the server may still read it. Each bucket is one
awaited call (``deliver``) that returns only after the server has copied the bucket into its model (and,
on a GPU, synchronised), so the next bucket may overwrite it.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from multiprocessing import shared_memory
from typing import Any

import torch

DEFAULT_BUCKET_BYTES = 512 << 20
_CREATED: set[str] = set()  # segments this process made (and will unlink itself)


@dataclass(frozen=True)
class TensorSlot:
    """Where one tensor lies in the buffer."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    offset: int


@dataclass(frozen=True)
class BufferHandle:
    """What the server needs to open the sender's buffer: a shared-memory name, or a CUDA IPC handle and
    the UUID of the GPU it lives on."""

    buffer_id: str
    size: int
    shm_name: str | None = None
    cuda_ipc: tuple[Any, tuple[Any, ...]] | None = None
    device_uuid: str | None = None


@dataclass
class UpdateStats:
    """What one update moved, for the server's record and the tests."""

    transport: str = ""
    buckets: int = 0
    tensors: int = 0
    bytes: int = 0
    buffers: list[int] = field(default_factory=list)  # the size of each buffer allocated, in order


def cuda_index_of(device_uuid: str, visible_uuids: list[str]) -> int:
    """This process's index of the GPU named by ``device_uuid`` (indices differ between processes that
    see different ``CUDA_VISIBLE_DEVICES``; UUIDs do not)."""
    if device_uuid not in visible_uuids:
        raise RuntimeError(f"the rollout server does not see GPU {device_uuid} that holds the weights to load.")
    return visible_uuids.index(device_uuid)


def visible_cuda_uuids() -> list[str]:
    """The UUIDs of the GPUs this process sees, in its own index order (none without CUDA)."""
    if not torch.cuda.is_available():
        return []
    return [str(torch.cuda.get_device_properties(i).uuid) for i in range(torch.cuda.device_count())]


class _SenderBuffer:
    """The sender's buffer: CUDA memory shared by IPC handle, or POSIX shared memory."""

    def __init__(self, size: int, device: torch.device) -> None:
        self._shm: shared_memory.SharedMemory | None = None
        buffer_id = uuid.uuid4().hex
        if device.type == "cuda":
            from torch.multiprocessing.reductions import reduce_tensor

            self.tensor = torch.empty(size, dtype=torch.uint8, device=device)
            uuid_ = str(torch.cuda.get_device_properties(device).uuid)
            self.handle = BufferHandle(buffer_id, size, cuda_ipc=reduce_tensor(self.tensor), device_uuid=uuid_)
        else:
            self._shm = shared_memory.SharedMemory(name=f"bridges_w_{buffer_id[:16]}", create=True, size=size)
            _CREATED.add(self._shm.name)
            self.tensor = torch.frombuffer(self._shm.buf, dtype=torch.uint8, count=size)
            self.handle = BufferHandle(buffer_id, size, shm_name=self._shm.name)

    @property
    def transport(self) -> str:
        return "cuda_ipc" if self.handle.cuda_ipc is not None else "shared_memory"

    def close(self) -> None:
        del self.tensor  # the view must go before the mapping under it
        if self._shm is not None:
            self._shm.close()
            self._shm.unlink()
            _CREATED.discard(self._shm.name)
            self._shm = None


def _aligned(offset: int, tensor: torch.Tensor) -> int:
    """Each tensor starts at a multiple of its element size, so the server can view the bytes as its dtype."""
    size = tensor.element_size()
    return (offset + size - 1) // size * size


async def send_buckets(
    weights: Iterable[tuple[str, torch.Tensor]],
    deliver: Callable[[BufferHandle, list[TensorSlot]], Awaitable[Any]],
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
) -> UpdateStats:
    """Pack ``weights`` into a shared buffer a bucket at a time and ``deliver`` each bucket (awaited: the
    server has copied it when the call returns). The buffer lives on the first tensor's device; a tensor
    larger than a bucket gets a buffer of its own size. The buffer is freed on every exit."""
    stats, buffer, slots, offset = UpdateStats(), None, [], 0
    try:
        for name, tensor in weights:
            tensor = tensor.detach()
            start = _aligned(offset, tensor)
            if buffer is not None and slots and start + tensor.nbytes > buffer.handle.size:
                await _deliver(buffer, slots, deliver, stats)
                slots, start = [], 0
            if buffer is None or tensor.nbytes > buffer.handle.size:
                if buffer is not None:
                    buffer.close()
                buffer = _SenderBuffer(max(bucket_bytes, tensor.nbytes, 1), tensor.device)
                stats.buffers.append(buffer.handle.size)
            # no name kept for the region: a live view of shared memory would keep it from closing
            buffer.tensor[start : start + tensor.nbytes].view(tensor.dtype).view(tensor.shape).copy_(tensor)
            slots.append(TensorSlot(name, tuple(tensor.shape), tensor.dtype, start))
            offset = start + tensor.nbytes
            stats.tensors, stats.bytes = stats.tensors + 1, stats.bytes + tensor.nbytes
        if buffer is not None and slots:
            await _deliver(buffer, slots, deliver, stats)
    finally:
        if buffer is not None:
            buffer.close()
    return stats


async def _deliver(
    buffer: _SenderBuffer,
    slots: list[TensorSlot],
    deliver: Callable[[BufferHandle, list[TensorSlot]], Awaitable[Any]],
    stats: UpdateStats,
) -> None:
    if buffer.tensor.device.type == "cuda":
        torch.cuda.synchronize(buffer.tensor.device)  # the copies into the buffer are queued, not done
    await deliver(buffer.handle, slots)
    stats.transport, stats.buckets = buffer.transport, stats.buckets + 1


class BucketReceiver:
    """The server's side: opens the sender's buffer (once per buffer) and views each bucket's tensors in
    it. The views are valid until the next call; the caller copies them out before returning."""

    def __init__(self) -> None:
        self._buffer_id = ""
        self._tensor: torch.Tensor | None = None
        self._shm: shared_memory.SharedMemory | None = None

    def views(self, handle: BufferHandle, slots: list[TensorSlot]) -> dict[str, torch.Tensor]:
        if handle.buffer_id != self._buffer_id:
            self.close()
            self._open(handle)
        assert self._tensor is not None
        views = {}
        for slot in slots:
            count = 1
            for dim in slot.shape:
                count *= dim
            nbytes = count * torch.empty((), dtype=slot.dtype).element_size()
            if slot.offset < 0 or slot.offset + nbytes > handle.size:
                raise ValueError(f"weight '{slot.name}' lies outside the shared buffer ({handle.size} bytes).")
            region = self._tensor[slot.offset : slot.offset + nbytes]
            views[slot.name] = region.view(slot.dtype).view(slot.shape)
        return views

    def _open(self, handle: BufferHandle) -> None:
        if handle.cuda_ipc is not None:
            rebuild, sent = handle.cuda_ipc
            args = list(sent)
            args[6] = cuda_index_of(str(handle.device_uuid), visible_cuda_uuids())  # the device index
            self._tensor = rebuild(*args)
        else:
            self._shm = _attach(str(handle.shm_name))
            self._tensor = torch.frombuffer(self._shm.buf, dtype=torch.uint8, count=handle.size)
        self._buffer_id = handle.buffer_id

    def close(self) -> None:
        """Drop this process's mapping of the buffer (the sender frees it). A view still held elsewhere
        keeps shared memory mapped until it goes: closing then is left to the garbage collector."""
        self._tensor, self._buffer_id = None, ""
        if self._shm is not None:
            with contextlib.suppress(BufferError):
                self._shm.close()
            self._shm = None


def _attach(name: str) -> shared_memory.SharedMemory:
    """Open the sender's segment without adopting it: Python 3.11's resource tracker would otherwise
    unlink the sender's memory when this process exits (3.13 has ``track=False`` for this)."""
    from multiprocessing import resource_tracker

    segment = shared_memory.SharedMemory(name=name)
    if name not in _CREATED:  # the sender in this same process: its registration is its own
        resource_tracker.unregister(segment._name, "shared_memory")  # type: ignore[attr-defined]
    return segment
