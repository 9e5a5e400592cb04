"""verl rollout backend ``hf`` (``actor_rollout_ref.rollout.name=hf``): verl's rollout served by transformers.

verl 0.9.1 ships rollout servers for vLLM, SGLang and TensorRT-LLM only, so on a machine without a
GPU its trainer cannot sample at all, and on a GPU there is no slow-but-simple path to debug a run
against. This backend plugs into verl's own registries (``RolloutReplicaRegistry`` and the async
``BaseRollout`` table) and implements the contract verl's other servers do:
- ``HFReplica.launch_servers`` starts one ``HFRolloutServer`` Ray actor per replica, named so the
  trainer-side adapter can find it, on the node of the replica's first worker and computing on that
  worker's GPU (``replica_device``; the CPU in CPU mode);
- ``HFRolloutServer.generate`` answers verl's token-in/token-out call (``prompt_ids`` +
  ``sampling_params`` -> ``TokenOutput`` with one logprob per sampled id) from our transformers
  engine, and takes the lifecycle calls verl makes around weight syncs (all no-ops: nothing to page out);
- ``HFServerAdapter.update_weights`` receives the actor's weights from verl's checkpoint engine each
  step (``named_tensors``); the replica's leader hands them to its server through a shared buffer on
  their common GPU (or shared memory in CPU mode: ``weight_buckets``), or, were the server on another
  node, as host copies through Ray.
Registration happens in every verl process through ``bridges.adapters.verl.plugin``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, cast

from bridges.envs.types import SamplingParams
from bridges.models.weight_buckets import (
    BucketReceiver,
    BufferHandle,
    TensorSlot,
    cuda_index_of,
    send_buckets,
    visible_cuda_uuids,
)
from bridges.runtime.errors import require_extra

if TYPE_CHECKING:
    from verl.workers.rollout.base import BaseRollout
    from verl.workers.rollout.replica import RolloutReplica, TokenOutput
else:
    _base = require_extra("verl.workers.rollout.base", "verl", "verl's hf rollout")
    _replica = require_extra("verl.workers.rollout.replica", "verl", "verl's hf rollout")
    BaseRollout, RolloutReplica, TokenOutput = (
        _base.BaseRollout,
        _replica.RolloutReplica,
        _replica.TokenOutput,
    )

NAME = "hf"


def server_name(replica_rank: int) -> str:
    return f"bridges_hf_rollout_server_{replica_rank}"


def to_sampling_params(raw: dict[str, Any], response_length: int) -> SamplingParams:
    """verl's per-request sampling dict -> ours; verl omits ``max_tokens`` when the loop does not cap a
    turn, and then the rollout's response length is the cap."""
    top_k = int(raw.get("top_k", -1) or -1)
    return SamplingParams(
        max_tokens=int(raw.get("max_tokens") or response_length),
        temperature=float(raw.get("temperature", 1.0)),
        top_p=float(raw.get("top_p", 1.0)),
        top_k=max(0, top_k),
        stop=list(raw.get("stop") or []),
        stop_token_ids=list(raw.get("stop_token_ids") or []),
        seed=raw.get("seed"),
    )


class HFRolloutServer:
    """One replica's server (a Ray actor): a transformers engine over the model, new weights each step.

    Also usable in-process wherever verl's server client is expected (``bridges.compare``, tests); the
    engine is created on first use, so an instance pickles into verl's Ray workers."""

    def __init__(self, model_path: str, response_length: int = 1 << 30, device: str = "auto") -> None:
        self.model_path = model_path
        self.response_length = response_length
        self.device = device  # the replica's own GPU (replica_device), or the CPU
        self.global_steps = 0
        self._engine: Any = None
        self._receiver: BucketReceiver | None = None
        self._loaded: asyncio.Event | None = None  # cleared while a bucketed update is half loaded
        self._broken = ""  # why the weights are unusable: an update that failed midway

    @property
    def engine(self) -> Any:
        if self._engine is None:
            from bridges.adapters.hf import HFEngine

            self._engine = HFEngine.from_pretrained(self.model_path, device=_resolve_device(self.device))
        return self._engine

    def __getstate__(self) -> dict[str, Any]:  # a copy in another process loads its own
        return {**self.__dict__, "_engine": None, "_receiver": None, "_loaded": None}

    def _weights_loaded(self) -> asyncio.Event:
        if self._loaded is None:
            self._loaded = asyncio.Event()
            self._loaded.set()
        return self._loaded

    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: Any = None,
        video_data: Any = None,
        **_: Any,
    ) -> TokenOutput:
        if image_data is not None or video_data is not None:
            raise ValueError("the hf rollout serves text models; this request carries images or video.")
        params = to_sampling_params(sampling_params, self.response_length)
        await self._weights_loaded().wait()  # never a mix of two steps' weights
        if self._broken:
            raise RuntimeError(self._broken)
        sample = (await self.engine.generate(list(prompt_ids), params))[0]
        return TokenOutput(token_ids=sample.token_ids, log_probs=sample.logprobs, stop_reason="completed",
                           extra_fields={"global_steps": self.global_steps})

    async def update_weights(self, tensors: dict[str, Any], global_steps: int | None = None) -> int:
        await self.engine.aupdate_weights(tensors)
        if global_steps is not None:
            self.global_steps = global_steps
        return self.engine.weight_version

    def weight_version(self) -> int:
        return self.engine.weight_version

    # a bucketed update (weight_buckets): begin, one load per bucket, end; generation waits throughout
    def node_id(self) -> str:
        import ray

        return str(ray.get_runtime_context().get_node_id())

    async def begin_weights(self) -> None:
        self._weights_loaded().clear()
        self._receiver = self._receiver or BucketReceiver()

    async def load_bucket(self, handle: BufferHandle, slots: list[TensorSlot]) -> None:
        """Copy one bucket out of the sender's buffer into the model; on return the sender may reuse it."""
        assert self._receiver is not None, "load_bucket outside begin_weights/end_weights"
        views = self._receiver.views(handle, slots)
        await self.engine.aupdate_weights(views, version=self.engine.weight_version)  # checked, then copied
        del views
        if self.engine.device.type == "cuda":
            import torch

            torch.cuda.synchronize(self.engine.device)  # the copy is queued; the buffer is read until it runs

    async def end_weights(self, global_steps: int | None, complete: bool) -> int:
        if self._receiver is not None:
            self._receiver.close()
        if complete:
            await self.engine.aupdate_weights({}, version=self.engine.weight_version + 1)
            self.global_steps = self.global_steps if global_steps is None else global_steps
            self._broken = ""
        else:
            self._broken = "the rollout server's weights are half updated: the trainer's last weight sync failed."
        self._weights_loaded().set()
        return int(self.engine.weight_version)

    # lifecycle calls verl makes around generation and weight syncs: nothing to page in or out here
    async def wake_up(self, tags: list[str] | None = None) -> None: ...
    async def sleep(self) -> None: ...
    async def clear_kv_cache(self) -> None: ...
    async def release_kv_cache(self) -> None: ...
    async def resume_kv_cache(self) -> None: ...
    async def resume_generation(self) -> None: ...
    async def start_profile(self, **_: Any) -> None: ...
    async def stop_profile(self) -> None: ...

    async def abort_all_requests(self, reject_request: bool = False) -> dict[str, Any]:
        return {}

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps


def replica_device(accelerator_ids: list[str], device_uuid: str | None = None) -> str:
    """Where a replica's server computes: the GPU of the replica's first worker, or the CPU when its
    workers hold none. Each replica on its own GPU: without this every server took cuda:0. The server
    sees every GPU of its node (as verl's own servers do) in CUDA's order, which need not be Ray's, so
    the worker's GPU is named by UUID where the worker could read it ("cuda-uuid:..."), resolved by the
    server; Ray's accelerator id otherwise."""
    if not accelerator_ids:
        return "cpu"
    return f"cuda-uuid:{device_uuid}" if device_uuid else f"cuda:{int(accelerator_ids[0])}"


def _resolve_device(device: str) -> str:
    if device.startswith("cuda-uuid:"):
        return f"cuda:{cuda_index_of(device.removeprefix('cuda-uuid:'), visible_cuda_uuids())}"
    return device


async def _first_worker_place(workers: list[Any]) -> tuple[str | None, list[str], str | None]:
    """The node id, GPU ids and GPU UUID of a replica's first worker (None, [], None with no workers:
    standalone). The UUID is None where the worker sees no CUDA device (CPU mode's logical GPUs)."""
    if not workers:
        return None, [], None
    import ray

    def where(_: Any) -> tuple[str, list[str], str | None]:
        context = ray.get_runtime_context()
        gpus = list(context.get_accelerator_ids().get("GPU", []))
        uuids = visible_cuda_uuids() if gpus else []
        return context.get_node_id(), gpus, (uuids[0] if uuids else None)

    node, gpus, uuid = await workers[0].__ray_call__.remote(where)
    return str(node), [str(g) for g in gpus], uuid


class HFReplica(RolloutReplica):
    """verl's ``RolloutReplica`` for ``rollout.name=hf``: one server actor, addressed by name, on its
    first worker's node and GPU."""

    async def launch_servers(self) -> None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        from verl.plugin.platform import get_platform
        from verl.utils.config import omega_conf_to_dataclass
        from verl.workers.config import HFModelConfig

        from bridges.adapters.verl.placement import CPU_FLAG

        name = server_name(self.replica_rank)
        # verl types it HFModelConfig and hands over the DictConfig: resolved here (a local copy of the path)
        model = omega_conf_to_dataclass(cast(Any, self.model_config), dataclass_type=HFModelConfig)
        env_vars = {var: "1" for var in get_platform().ray_noset_envvars()}  # see the GPUs, if any
        # CPU mode declares one logical GPU for verl's resource pool: its id names no device
        node, gpus, uuid = await _first_worker_place(list(self.workers))
        placement = {} if node is None else {"scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False)}
        server: Any = (
            ray.remote(HFRolloutServer)
            .options(name=name, max_concurrency=self.max_concurrency, runtime_env={"env_vars": env_vars}, num_cpus=0,
                     **placement)
            .remote(model_path=str(model.local_path), response_length=int(self.config.response_length),
                    device="cpu" if os.environ.get(CPU_FLAG) == "1" else replica_device(gpus, uuid))
        )
        self.servers = [server]
        self._server_handle = server
        self._server_address = name  # token-in/token-out needs no HTTP; the load balancer keys on it


class HFServerAdapter(BaseRollout):
    """The trainer side of ``rollout.name=hf`` (built by verl inside each actor/rollout worker)."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, replica_rank: int = -1) -> None:
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", "0"))
        world = self.config.tensor_model_parallel_size * self.config.data_parallel_size
        world *= self.config.pipeline_model_parallel_size
        self.replica_rank = rank // world if replica_rank == -1 else replica_rank
        self.leader = rank % world == 0  # one rank per replica sends the weights
        self._server: Any = None
        self._same_node = False  # the leader and its server share a node (always, as HFReplica places it)

    async def resume(self, tags: list[str]) -> None: ...

    async def release(self) -> None: ...

    async def update_weights(self, weights: Any, wire_format: str = "named_tensors", **kwargs: Any) -> None:
        if wire_format != "named_tensors":
            raise ValueError(f"the hf rollout takes full named tensors, not '{wire_format}' updates.")
        if kwargs.get("peft_config") is not None:
            raise ValueError(
                "the hf rollout takes merged weights; set verl.actor_rollout_ref.model.lora.merge=true."
            )
        full = _full_tensors(weights)
        if not self.leader:
            for _ in full:  # consumed on every rank: the generator may gather collectively
                pass
            return
        import ray

        steps = kwargs.get("global_steps")
        if self._server is None:
            self._server = ray.get_actor(server_name(self.replica_rank))
            self._same_node = await self._server.node_id.remote() == ray.get_runtime_context().get_node_id()
        if not self._same_node:
            tensors = {name: tensor.to("cpu", copy=True) for name, tensor in full}
            await self._server.update_weights.remote(tensors, steps)
            return
        await push_buckets(self._server, full, steps, _bucket_bytes(self.config))


def _bucket_bytes(rollout: Any) -> int:
    """verl's own knob for its servers' weight buckets (``rollout.checkpoint_engine``), in bytes."""
    return int(rollout.checkpoint_engine.update_weights_bucket_megabytes) << 20


def _full_tensors(weights: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    for name, tensor in weights:  # a DTensor shard is gathered whole (a collective on every rank)
        yield name, (tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor).detach()


async def push_buckets(server: Any, weights: Iterable[tuple[str, Any]], steps: int | None, bucket_bytes: int) -> int:
    """One bucketed update of ``server`` (a Ray actor handle of ``HFRolloutServer``): generation waits
    from the first bucket to the last, and an update that fails midway leaves the server refusing to
    generate on half-updated weights. Returns the server's new weight version."""
    await server.begin_weights.remote()
    complete = False
    try:
        await send_buckets(weights, lambda handle, slots: server.load_bucket.remote(handle, slots), bucket_bytes)
        complete = True
    finally:
        version = await server.end_weights.remote(steps, complete)
    return int(version)


def register() -> None:
    """Make ``rollout.name=hf`` known to verl in this process (idempotent). Runs when this module is
    imported: a Ray worker may import it first (to build the server actor), and then ``import verl``
    loads the plugin while this module is still half-initialised."""
    from verl.workers.rollout import base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    RolloutReplicaRegistry.register(NAME, lambda: HFReplica)
    base._ROLLOUT_REGISTRY[(NAME, "async")] = f"{__name__}.HFServerAdapter"


register()
