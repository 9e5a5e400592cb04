"""Several training processes: each rolls out and trains its share of a step; only gradients and
metrics cross between them.

A process learns its place from the variables every launcher sets — ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT`` — whether ``bridges.train trainer.num_processes=N``
(``bridges.runtime.launch``), ``torchrun`` or ``accelerate launch`` started it; the process group is NCCL on
GPUs and gloo on the CPU. Two strategies (``trainer.strategy``):
- ``ddp``: every process holds the whole model; after the step's backward passes the gradients are
  summed across processes in fp32 (one all-reduce per bucket). A step's loss is normalised by the
  global number of samples, so the sum is exactly the one-process gradient of the same global batch.
- ``fsdp``: FSDP2 (``fully_shard``) on every decoder layer and the root: parameters, gradients and
  AdamW state sharded (what ZeRO-3 shards); parameters stored fp32 and gathered in ``trainer.dtype``
  for compute, gradients reduced in fp32. FSDP averages gradients, so the loss is scaled by the
  number of processes to sum them like ``ddp``. Every process must run the same number of forward and
  backward passes (each is a collective): ``padded_chunk_count`` makes them equal.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import os
import secrets
import socket
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from bridges.runtime.errors import ConfigError

BUCKET_ELEMENTS = 32 * 1024 * 1024  # gradients all-reduced per call in ddp (128 MB of fp32)


@dataclasses.dataclass(frozen=True)
class World:
    """This process's place among the training processes (one process: rank 0 of 1)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    strategy: str = "ddp"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    @property
    def sharded(self) -> bool:
        return self.distributed and self.strategy == "fsdp"


ONE_PROCESS = World()


def world_from_env(strategy: str = "ddp") -> World:
    return World(int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")),
                 int(os.environ.get("LOCAL_RANK", "0")), strategy)


def start(world: World, device: torch.device) -> None:
    """Join the process group (NCCL on CUDA, bound to this rank's GPU; gloo on the CPU); nothing for
    one process. The main thread is bound to the device either way (``hardware.bind_thread``)."""
    from bridges.models.hardware import bind_thread

    bind_thread(device)
    if not world.distributed or dist.is_initialized():
        return
    timeout = datetime.timedelta(minutes=10)
    backend = "nccl" if device.type == "cuda" else "gloo"
    where: dict[str, Any] = {"store": store, "rank": world.rank, "world_size": world.size} if (
        store := restarted_group_store(timeout)) is not None else {}
    if device.type == "cuda":  # the group bound to this rank's GPU: collectives never guess a device
        dist.init_process_group(backend, timeout=timeout, device_id=device, **where)
    else:
        dist.init_process_group(backend, timeout=timeout, **where)


def restarted_group_store(timeout: datetime.timedelta) -> Any:
    """A worker group one torchrun started again (``--max-restarts``, one node): its rendezvous keys under a
    prefix of their own. torchrun's static rendezvous keeps one store across attempts, so a restarted rank read
    a dead rank's address from the attempt before and failed ("connectFullMesh ... Connection refused"). Across
    nodes the count is not shared (torchrun's c10d rendezvous gives each round a new store instead): None."""
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if not restart or os.environ.get("GROUP_WORLD_SIZE", "1") != "1":
        return None
    return launcher_store(timeout, f"bridges-attempt-{restart}")[0]


def launcher_store(timeout: datetime.timedelta, prefix: str) -> tuple[Any, str]:
    """One more client of the store every launcher starts at ``MASTER_ADDR:MASTER_PORT`` (its own connection),
    its keys under ``prefix``; and the address, for sentences about it."""
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    client = dist.TCPStore(host, port, is_master=False, wait_for_workers=False, timeout=timeout)
    return dist.PrefixStore(prefix, client), f"{host}:{port}"


def stop(finished: bool = False) -> None:
    """Leave the process group. ``finished``: every process reached the end, so they first meet at a
    barrier and tear down together; a process that tore its gloo pairs down while a peer was still
    finishing its last collective was seen aborting ("terminate called without an active exception").
    After an error there is no barrier: the peers may never arrive, and the launcher stops them."""
    if dist.is_initialized():
        if finished:
            dist.barrier()
        dist.destroy_process_group()


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks transformers names in ``_no_split_modules`` (what FSDP wraps one by one)."""
    from transformers import PreTrainedModel

    names: set[str] = set()
    for module in model.modules():
        if isinstance(module, PreTrainedModel):
            names |= set(module._no_split_modules or [])
    return [m for m in model.modules() if type(m).__name__ in names]


def shard(model: torch.nn.Module, world: World, compute_dtype: torch.dtype) -> torch.nn.Module:
    """``fsdp``: FSDP2 on each decoder layer, then the root (in place); otherwise the model unchanged."""
    if not world.sharded:
        return model
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    for layer in decoder_layers(model):
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model


def loss_weight(world: World, global_samples: int) -> float:
    """What each sample's loss is multiplied by so the processes' gradients add up to the mean over
    the global batch (FSDP divides by the number of processes when it reduces; ddp sums)."""
    return (world.size if world.sharded else 1.0) / global_samples


def sum_gradients(params: list[torch.nn.Parameter], world: World) -> None:
    """``ddp``: every process's gradients replaced by their sum over processes, in fp32 buckets."""
    if not world.distributed or world.sharded:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    start_index = 0
    while start_index < len(grads):
        bucket: list[torch.Tensor] = []
        size = 0
        while start_index < len(grads) and (not bucket or size + grads[start_index].numel() <= BUCKET_ELEMENTS):
            bucket.append(grads[start_index])
            size += grads[start_index].numel()
            start_index += 1
        flat = torch.cat([g.reshape(-1).to(torch.float32) for g in bucket])
        dist.all_reduce(flat)
        offset = 0
        for grad in bucket:
            grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
            offset += grad.numel()
    for param, grad in zip(params, grads, strict=True):
        param.grad = grad


def reduce_sum(values: list[float], world: World, device: torch.device) -> list[float]:
    """Element-wise sums over processes (the values themselves for one process)."""
    if not world.distributed:
        return list(values)
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return [float(v) for v in tensor.tolist()]


def reduce_max(value: float, world: World, device: torch.device) -> float:
    if not world.distributed:
        return value
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return float(tensor.item())


def combine_tallies(tallies: dict[str, float], world: World) -> dict[str, float]:
    """Per-process step tallies added up (keys starting ``max/`` take the maximum); every process
    gets the same result. The keys may differ between processes (a stop reason seen by one only)."""
    if not world.distributed:
        return tallies
    gathered: list[Any] = [None] * world.size
    dist.all_gather_object(gathered, tallies)
    combined: dict[str, float] = {}
    for part in gathered:
        for key, value in part.items():
            if key.startswith("max/"):
                combined[key] = max(combined.get(key, -math.inf), value)
            else:
                combined[key] = combined.get(key, 0.0) + value
    return combined


def full_state_dict(model: torch.nn.Module, names: set[str] | None = None) -> dict[str, torch.Tensor]:
    """The model's whole tensors by name (``names``: only those), on every process; sharded parameters
    are gathered (a collective: every process calls it)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return {k: v for k, v in state.items() if isinstance(v, torch.Tensor) and (names is None or k in names)}


def load_full_state(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Whole tensors by name into the model (sharded to each process's part under fsdp; cast to the
    parameters' dtype); names the model lacks are an error, tensors not given are left as they are."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    own = set(model.state_dict())
    unknown = [k for k in tensors if k not in own and "lm_head" not in k]
    if unknown:
        raise RuntimeError(f"tensors the model does not have: {unknown[:3]}")
    set_model_state_dict(model, {k: v for k, v in tensors.items() if k in own},
                         options=StateDictOptions(full_state_dict=True, strict=False))


def checkpoint_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, world: World
) -> tuple[dict[str, torch.Tensor], dict[str, Any]] | None:
    """The model's whole tensors and the optimizer's whole state, on the main process's CPU; None on
    the others. Under ``fsdp`` both are gathered from the shards one tensor at a time straight into
    the main process's host memory (a collective: every process calls it), so no process ever holds
    the whole model or the whole AdamW state on its GPU, where FSDP was needed because it would not
    fit. Optimizer state is keyed by position (one process, ``ddp``) or by tensor name (``fsdp``)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    if not world.sharded:
        if not world.is_main:
            return None
        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}, optimizer.state_dict()
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state = get_model_state_dict(model, options=options)
    optim_state = get_optimizer_state_dict(model, optimizer, options=options)
    if not world.is_main:
        return None
    return {k: v for k, v in model_state.items() if isinstance(v, torch.Tensor)}, optim_state


def load_optimizer_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any], world: World
) -> None:
    if not world.sharded:
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))


def grad_norm_value(norm: torch.Tensor) -> float:
    """``clip_grad_norm_``'s result as a float (a replicated DTensor under FSDP)."""
    from torch.distributed.tensor import DTensor

    return float(norm.full_tensor() if isinstance(norm, DTensor) else norm)


def barrier(world: World) -> None:
    if world.distributed:
        dist.barrier()


def share(value: Any, world: World) -> Any:
    """The main process's ``value`` on every process (a collective: every process calls it)."""
    if not world.distributed:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def check_shared_run_folder(run_dir: Path, world: World) -> None:
    """Several processes write one run folder (metrics and checkpoints from rank 0, every rank's traces)
    and resume from the checkpoints in it, so every rank must see the same folder: on several machines,
    a shared filesystem. Checked before any step, in three collectives: rank 0 writes a token file there
    and every rank reads it. A rank that cannot is named in one sentence now, not found later as two
    ranks resuming from different steps and waiting on each other until a collective times out."""
    if not world.distributed:
        return
    token = share(secrets.token_hex(8) if world.is_main else None, world)
    marker = run_dir / f".shared-{token}"
    if world.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        marker.write_text(token)
    barrier(world)
    try:
        sees = marker.read_text() == token
    except OSError:
        sees = False
    seen: list[Any] = [None] * world.size
    dist.all_gather_object(seen, (sees, socket.gethostname(), str(run_dir.resolve())))
    if world.is_main:
        marker.unlink(missing_ok=True)
    blind = [f"rank {rank} on {host} ({path})" for rank, (ok, host, path) in enumerate(seen) if not ok]
    if blind:
        raise ConfigError(
            f"{', '.join(blind)} does not see the run folder rank 0 writes ({seen[0][2]} on {seen[0][1]}): the "
            "ranks of one run share one run folder, so on several machines output_dir must be on a filesystem "
            "every node mounts at the same path (docs/guide/scaling.md, several machines)."
        )


def check_agreement(what: str, value: Any, world: World) -> None:
    """Every rank holds the same ``value`` (one collective), or one sentence naming what each rank holds:
    ranks that started from different checkpoints would wait on each other's collectives until a timeout."""
    if not world.distributed:
        return
    held: list[Any] = [None] * world.size
    dist.all_gather_object(held, value)
    if any(v != held[0] for v in held[1:]):
        each = ", ".join(f"rank {rank}: {v}" for rank, v in enumerate(held))
        raise ConfigError(f"the ranks do not agree on {what} ({each}); start them again on one run folder.")
