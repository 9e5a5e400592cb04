"""verl's hf rollout: weights from the replica's leader to its server through one shared buffer.

On the CPU the buffer is shared memory, on a GPU CUDA memory shared by IPC handle; everything but the
buffer's allocation and opening is one code path, run here for real (in-process and across a Ray actor).
The CUDA branch is checked at its seam: the device index inside torch's IPC handle, re-mapped by UUID.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest
import torch

from bridges.adapters.verl.hf_rollout import HFRolloutServer, push_buckets
from bridges.models.weight_buckets import (
    BucketReceiver,
    BufferHandle,
    TensorSlot,
    cuda_index_of,
    send_buckets,
)


def _new_weights(tiny_path: Path, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    generator = torch.Generator().manual_seed(7)
    state = AutoModelForCausalLM.from_pretrained(tiny_path).state_dict()
    moved: dict[int, torch.Tensor] = {}  # tied tensors (embedding and head) move together
    for tensor in state.values():
        moved.setdefault(tensor.data_ptr(), (tensor + 0.05 * torch.randn(tensor.shape, generator=generator)).to(dtype))
    return {name: moved[tensor.data_ptr()] for name, tensor in state.items()}


async def test_buckets_pack_mixed_dtypes_aligned_and_grow_for_a_tensor_larger_than_a_bucket():
    int8 = torch.arange(3, dtype=torch.int8)  # 3 bytes: the next fp32 tensor must start at 4
    fp32 = torch.linspace(-1, 1, 5)
    bf16 = torch.randn(7, dtype=torch.bfloat16)
    big = torch.randn(64, 8)  # 2 KiB: larger than the 256-byte bucket
    received: dict[str, torch.Tensor] = {}
    offsets: list[list[int]] = []
    receiver = BucketReceiver()

    async def deliver(handle: BufferHandle, slots: list[TensorSlot]) -> None:
        offsets.append([slot.offset for slot in slots])
        received.update({name: view.clone() for name, view in receiver.views(handle, slots).items()})

    weights = [("a", int8), ("b", fp32), ("c", bf16), ("big", big), ("d", fp32 * 2)]
    stats = await send_buckets(iter(weights), deliver, bucket_bytes=256)
    receiver.close()
    for name, tensor in weights:
        assert received[name].dtype == tensor.dtype and torch.equal(received[name], tensor), name
    assert offsets[0] == [0, 4, 24] and all(o % 4 == 0 for bucket in offsets for o in bucket)
    assert stats.transport == "shared_memory" and stats.tensors == 5 and stats.bytes == 3 + 20 + 14 + 2048 + 20
    assert stats.buffers == [256, 2048] and stats.buckets == 3  # [a b c], [big], [d] in the grown buffer


async def test_a_zero_bucket_setting_sends_each_tensor_alone_even_an_empty_one():
    receiver = BucketReceiver()
    got: dict[str, torch.Tensor] = {}

    async def deliver(handle: BufferHandle, slots: list[TensorSlot]) -> None:
        got.update({name: view.clone() for name, view in receiver.views(handle, slots).items()})

    stats = await send_buckets(iter([("empty", torch.ones(0)), ("w", torch.ones(3))]), deliver, bucket_bytes=0)
    receiver.close()
    assert got["empty"].shape == (0,) and torch.equal(got["w"], torch.ones(3)) and stats.buffers == [1, 12]


async def test_a_failing_sender_frees_its_buffer():
    names: list[str] = []

    async def deliver(handle: BufferHandle, slots: list[TensorSlot]) -> None:
        names.append(str(handle.shm_name))
        raise ConnectionError("the server went away")

    with pytest.raises(ConnectionError):
        await send_buckets(iter([("w", torch.ones(4))]), deliver, bucket_bytes=64)
    from multiprocessing import shared_memory

    with pytest.raises(FileNotFoundError):
        shared_memory.SharedMemory(name=names[0])


async def test_the_server_loads_every_bucket_and_takes_one_new_version(tiny_path: Path):
    """Many small buckets (and a grown buffer for the embedding), bf16 weights into an fp32 model: the
    server ends with exactly the sent values, one version higher, and samples as a fresh copy would."""
    server = HFRolloutServer(str(tiny_path), device="cpu")
    before = server.weight_version()
    new = _new_weights(tiny_path, torch.bfloat16)

    class Handle:  # the Ray actor handle's shape over the in-process server
        def __getattr__(self, name: str) -> Any:
            return type("Method", (), {"remote": staticmethod(getattr(server, name))})

    version = await push_buckets(Handle(), iter(new.items()), steps=3, bucket_bytes=4096)
    own = server.engine.model.state_dict()
    assert all(torch.equal(own[name], tensor.float()) for name, tensor in new.items())
    assert version == before + 1 == server.weight_version() and server.global_steps == 3

    fresh = HFRolloutServer(str(tiny_path), device="cpu")
    await fresh.update_weights({k: v.float() for k, v in new.items()})
    params = {"temperature": 0.0, "max_tokens": 8}
    ours = await server.generate("r", prompt_ids=[5, 6, 7], sampling_params=params)
    theirs = await fresh.generate("r", prompt_ids=[5, 6, 7], sampling_params=params)
    assert ours.token_ids == theirs.token_ids and ours.log_probs == pytest.approx(theirs.log_probs, abs=1e-5)


async def test_an_update_that_fails_midway_stops_generation_on_half_updated_weights(tiny_path: Path):
    server = HFRolloutServer(str(tiny_path), device="cpu")
    await server.begin_weights()
    assert await server.end_weights(None, complete=False) == server.weight_version()
    with pytest.raises(RuntimeError, match="half updated"):
        await server.generate("r", prompt_ids=[5], sampling_params={"max_tokens": 2})
    await server.begin_weights()
    await server.end_weights(1, complete=True)  # the next complete sync clears it
    out = await server.generate("r", prompt_ids=[5], sampling_params={"max_tokens": 2})
    assert len(out.token_ids) == 2


@pytest.mark.slow
@pytest.mark.usefixtures("ray_alone")
async def test_a_ray_actor_server_reads_the_leaders_shared_memory(tiny_path: Path):
    """Across processes as in a verl run: the server is a Ray actor on this node, the driver the leader."""
    import ray
    from local_ray import start_local_ray

    start_local_ray(num_cpus=1)
    try:
        server = ray.remote(HFRolloutServer).options(num_cpus=0).remote(str(tiny_path), device="cpu")
        assert await server.node_id.remote() == ray.get_runtime_context().get_node_id()
        new = _new_weights(tiny_path)
        version = await push_buckets(server, iter(new.items()), steps=2, bucket_bytes=1 << 16)
        fresh = HFRolloutServer(str(tiny_path), device="cpu")
        await fresh.update_weights(new)
        params = {"temperature": 0.0, "max_tokens": 6}
        ours = await server.generate.remote("r", prompt_ids=[9, 10], sampling_params=params)
        theirs = await fresh.generate("r", prompt_ids=[9, 10], sampling_params=params)
    finally:
        ray.shutdown()
    assert version == 1 and ours.token_ids == theirs.token_ids


def test_a_cuda_handle_is_opened_on_the_gpu_with_the_senders_uuid(monkeypatch: pytest.MonkeyPatch):
    """torch's IPC handle carries the sender's device index at position 6; the server, seeing the node's
    GPUs in another order, opens it on the index whose UUID matches (faked at the UUID seam)."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    from bridges.models import weight_buckets

    assert list(inspect.signature(rebuild_cuda_tensor).parameters)[6] == "storage_device"
    opened: list[Any] = []

    def rebuild(*args: Any) -> torch.Tensor:
        opened.append(args)
        return torch.zeros(16, dtype=torch.uint8)

    monkeypatch.setattr(weight_buckets, "visible_cuda_uuids", lambda: ["GPU-aa", "GPU-bb", "GPU-cc"])
    handle = BufferHandle("b1", 16, cuda_ipc=(rebuild, tuple(range(9))), device_uuid="GPU-cc")
    views = BucketReceiver().views(handle, [TensorSlot("w", (2,), torch.float32, 8)])
    assert opened[0][6] == 2 and opened[0][:6] == (0, 1, 2, 3, 4, 5) and views["w"].shape == (2,)
    assert cuda_index_of("GPU-aa", ["GPU-aa"]) == 0
    with pytest.raises(RuntimeError, match="does not see GPU GPU-zz"):
        cuda_index_of("GPU-zz", ["GPU-aa"])
    with pytest.raises(ValueError, match="outside the shared buffer"):
        BucketReceiver().views(handle, [TensorSlot("w", (4,), torch.float32, 8)])
