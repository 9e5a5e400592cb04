"""New weights over a collective channel: the tensors of a payload broadcast from trainer to server.

A push over HTTP (``weight_payload``) carries every byte in the request body, through the CPU. On GPUs
the bytes should go device to device, as vLLM's weight sync does with NCCL: here the request body
carries only a manifest (kind, version, scalings, each tensor's name, dtype and shape), and the
tensors follow in broadcasts over a process group of two — the trainer (rank 0) and one server
(rank 1). NCCL on CUDA; gloo on the CPU, which proves the same code here.

Why a group per server rather than one group of the trainer and every server: a collective needs
every member, so one dead server would stall every push until the group was rebuilt with the
others' consent. Pairs fail alone; the cost is one broadcast per server instead of one in all.

The trainer owns a ``TCPStore`` (unauthenticated: a server is told its address over the
weights-key route, and a pair's keys live under a prefix made for it). The store also carries the
one handshake a push needs: the server marks a push ready once it has refused nothing and is
receiving, so a trainer never broadcasts into a server that answered no.
"""

from __future__ import annotations

import contextlib
import datetime
import math
from dataclasses import dataclass
from typing import Any

import torch

from bridges.models.weight_payload import (
    KINDS,
    Payload,
    WeightPayloadError,
    checked_run,
    checked_scaling,
    checked_version,
)

BACKENDS = ("gloo", "nccl")
BUCKET_BYTES = 256 * 1024**2  # consecutive tensors of one dtype travel in one broadcast up to this size
_DTYPES = {str(dtype).removeprefix("torch."): dtype for dtype in
           (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.uint8)}


@dataclass(frozen=True)
class Manifest:
    """What a channel push is, sent as the request body; the tensors follow on the channel."""

    push: int  # the trainer's number for this push: the key of its ready mark
    kind: str
    version: int
    scaling: dict[str, float]
    tensors: list[tuple[str, torch.dtype, tuple[int, ...]]]  # name, dtype, shape, in broadcast order
    run: str = ""

    @classmethod
    def of(cls, payload: Payload, push: int) -> Manifest:
        tensors = [(name, t.dtype, tuple(t.shape)) for name, t in payload.tensors.items()]
        return cls(push, payload.kind, payload.version, dict(payload.scaling), tensors, payload.run)

    def nbytes(self) -> int:
        return sum(math.prod(shape) * dtype.itemsize for _, dtype, shape in self.tensors)

    def to_json(self) -> dict[str, Any]:
        return {"channel": {"push": self.push}, "kind": self.kind, "version": self.version,
                "scaling": self.scaling, "run": self.run,
                "tensors": [[n, str(d).removeprefix("torch."), list(s)] for n, d, s in self.tensors]}

    @classmethod
    def from_json(cls, body: Any) -> Manifest:
        """The manifest in a request body, or ``WeightPayloadError`` saying what is wrong with it."""
        try:
            tensors = [(str(n), _DTYPES[d], tuple(int(x) for x in s)) for n, d, s in body["tensors"]]
            push = checked_version(body["channel"]["push"])  # the trainer's push counter: the same bound
            manifest = cls(push, str(body["kind"]), checked_version(body["version"]),
                           checked_scaling(body.get("scaling")), tensors, checked_run(body.get("run")))
        except WeightPayloadError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError):
            raise WeightPayloadError(
                "a channel push's body must be a manifest: {channel: {push}, kind, version, scaling, "
                f"tensors: [[name, dtype, shape], ...]}} with dtypes among {sorted(_DTYPES)}."
            ) from None
        if manifest.kind not in KINDS or manifest.version < 0 or any(x < 0 for *_, s in tensors for x in s):
            raise WeightPayloadError("a channel push's manifest needs kind 'full' or 'lora' and no negative number.")
        return manifest


def check_backend(backend: str) -> None:
    """``WeightPayloadError`` unless this process can open a pair over ``backend``."""
    import torch.distributed as dist

    if backend not in BACKENDS:
        raise WeightPayloadError(f"the weight channel's backend must be one of {BACKENDS}, not {backend!r}.")
    if backend == "nccl" and not (dist.is_nccl_available() and torch.cuda.is_available()):
        raise WeightPayloadError("this process has no CUDA with NCCL, so it cannot open an nccl weight channel.")


class Pair:
    """One side of a trainer–server process group of two. ``rank`` 0 is the trainer, which sends."""

    def __init__(
        self, store: Any, prefix: str, rank: int, backend: str, timeout_s: float, device: torch.device | None = None
    ) -> None:
        """``device``: where this side's tensors are for nccl (the server's model, the trainer's policy; two
        processes on one GPU cannot pair over NCCL), the current CUDA device if not given; gloo: the CPU."""
        import torch.distributed as dist

        check_backend(backend)
        self.store, self.rank, self.backend = dist.PrefixStore(prefix, store), rank, backend
        self.device = _cuda_device(device) if backend == "nccl" else torch.device("cpu")
        timeout = datetime.timedelta(seconds=timeout_s)
        self.group: Any
        if backend == "nccl":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            self.group = dist.ProcessGroupNCCL(self.store, rank, 2, options)
        else:
            self.group = dist.ProcessGroupGloo(self.store, rank, 2, timeout)

    @classmethod
    def join(
        cls, host: str, port: int, prefix: str, backend: str, timeout_s: float, device: torch.device | None = None
    ) -> Pair:
        """The server's side: connect to the trainer's store and complete the group."""
        import torch.distributed as dist

        store = dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=timeout_s))
        return cls(store, prefix, 1, backend, timeout_s, device)

    def close(self) -> None:
        """End the group (a replaced or broken pair); its sockets close with it."""
        with contextlib.suppress(RuntimeError):
            self.group.abort()
        self.group = None

    def mark_ready(self, push: int) -> None:
        self.store.set(f"ready/{push}", "1")

    def is_ready(self, push: int) -> bool:
        return bool(self.store.check([f"ready/{push}"]))

    def send(self, tensors: list[torch.Tensor]) -> None:
        """The trainer: every tensor, in manifest order, in buckets."""
        for bucket in _buckets([(t.dtype, tuple(t.shape)) for t in tensors]):
            flat = torch.cat([tensors[i].detach().reshape(-1).to(self.device) for i in bucket])
            self._broadcast(flat)

    def receive(self, manifest: Manifest) -> dict[str, torch.Tensor]:
        """The server: the manifest's tensors, as the trainer sends them."""
        shapes = [(dtype, shape) for _, dtype, shape in manifest.tensors]
        received: dict[str, torch.Tensor] = {}
        for bucket in _buckets(shapes):
            dtype = shapes[bucket[0]][0]
            flat = torch.empty(sum(math.prod(shapes[i][1]) for i in bucket), dtype=dtype, device=self.device)
            self._broadcast(flat)
            for i, part in zip(bucket, flat.split([math.prod(shapes[i][1]) for i in bucket]), strict=True):
                received[manifest.tensors[i][0]] = part.view(shapes[i][1])
        return received

    def _broadcast(self, flat: torch.Tensor) -> None:
        import torch.distributed as dist

        options = dist.BroadcastOptions()
        options.rootRank, options.rootTensor = 0, 0
        with torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext():
            self.group.broadcast([flat], options).wait()


def _cuda_device(device: torch.device | None) -> torch.device:
    """``device`` with its index, or the current CUDA device where none (or a non-CUDA one) is given."""
    if device is None or device.type != "cuda" or device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _buckets(shapes: list[tuple[torch.dtype, tuple[int, ...]]]) -> list[list[int]]:
    """Consecutive indices of one dtype, each run cut at ``BUCKET_BYTES``: both sides compute the same."""
    buckets: list[list[int]] = []
    size = 0
    for i, (dtype, shape) in enumerate(shapes):
        nbytes = math.prod(shape) * dtype.itemsize
        if not buckets or shapes[buckets[-1][0]][0] != dtype or size + nbytes > BUCKET_BYTES:
            buckets.append([])
            size = 0
        buckets[-1].append(i)
        size += nbytes
    return buckets
