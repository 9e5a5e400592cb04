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
  step (``named_tensors``), copies them to CPU and hands them to the server through Ray.
Registration happens in every verl process through ``bridges.adapters.verl.plugin``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, cast

from bridges.envs.types import SamplingParams
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

    @property
    def engine(self) -> Any:
        if self._engine is None:
            from bridges.adapters.hf import HFEngine

            self._engine = HFEngine.from_pretrained(self.model_path, device=self.device)
        return self._engine

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_engine": None}  # a copy in another process loads its own

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
        sample = (await self.engine.generate(list(prompt_ids), params))[0]
        return TokenOutput(token_ids=sample.token_ids, log_probs=sample.logprobs, stop_reason="completed",
                           extra_fields={"global_steps": self.global_steps})  # fmt: skip

    async def update_weights(self, tensors: dict[str, Any], global_steps: int | None = None) -> int:
        await self.engine.aupdate_weights(tensors)
        if global_steps is not None:
            self.global_steps = global_steps
        return self.engine.weight_version

    def weight_version(self) -> int:
        return self.engine.weight_version

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


def replica_device(accelerator_ids: list[str]) -> str:
    """Where a replica's server computes: the GPU of the replica's first worker (Ray's accelerator id on
    that node; the server sees every GPU of the node, as verl's own servers do), or the CPU when its
    workers hold none. Each replica on its own GPU: without this every server took cuda:0."""
    return f"cuda:{int(accelerator_ids[0])}" if accelerator_ids else "cpu"


async def _first_worker_place(workers: list[Any]) -> tuple[str | None, list[str]]:
    """The node id and the GPU ids of a replica's first worker (None, [] with no workers: standalone)."""
    if not workers:
        return None, []
    import ray

    def where(_: Any) -> tuple[str, list[str]]:
        context = ray.get_runtime_context()
        return context.get_node_id(), list(context.get_accelerator_ids().get("GPU", []))

    node, gpus = await workers[0].__ray_call__.remote(where)
    return str(node), [str(g) for g in gpus]


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
        node, gpus = await _first_worker_place(list(self.workers))
        placement = {} if node is None else {"scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False)}
        server: Any = (
            ray.remote(HFRolloutServer)
            .options(name=name, max_concurrency=self.max_concurrency, runtime_env={"env_vars": env_vars}, num_cpus=0,
                     **placement)
            .remote(model_path=str(model.local_path), response_length=int(self.config.response_length),
                    device="cpu" if os.environ.get(CPU_FLAG) == "1" else replica_device(gpus))
        )  # fmt: skip
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

    async def resume(self, tags: list[str]) -> None: ...

    async def release(self) -> None: ...

    async def update_weights(self, weights: Any, wire_format: str = "named_tensors", **kwargs: Any) -> None:
        if wire_format != "named_tensors":
            raise ValueError(f"the hf rollout takes full named tensors, not '{wire_format}' updates.")
        if kwargs.get("peft_config") is not None:
            raise ValueError(
                "the hf rollout takes merged weights; set verl.actor_rollout_ref.model.lora.merge=true."
            )
        tensors = {}
        for name, tensor in weights:  # consumed on every rank: the generator may gather collectively
            full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
            tensors[name] = full.detach().to("cpu", copy=True)
        if not self.leader:
            return
        if self._server is None:
            import ray

            self._server = ray.get_actor(server_name(self.replica_rank))
        await self._server.update_weights.remote(tensors, kwargs.get("global_steps"))


def register() -> None:
    """Make ``rollout.name=hf`` known to verl in this process (idempotent). Runs when this module is
    imported: a Ray worker may import it first (to build the server actor), and then ``import verl``
    loads the plugin while this module is still half-initialised."""
    from verl.workers.rollout import base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    RolloutReplicaRegistry.register(NAME, lambda: HFReplica)
    base._ROLLOUT_REGISTRY[(NAME, "async")] = f"{__name__}.HFServerAdapter"


register()
