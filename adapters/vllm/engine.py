"""``VLLMEngine``: vLLM's in-process ``AsyncLLM`` behind the token-level ``Engine`` seam.

Checked only on a GPU machine: vLLM needs CUDA, so CPU CI tests the pure conversions here
(``sampling_kwargs``, ``samples_from_output``) and that this module imports without vLLM.

- Token in, token out: prompts go in as ``TokensPrompt(prompt_token_ids=...)``; the sampled ids
  and the logprob of each sampled id come back unchanged (``logprobs=0``). The engine is built with
  ``logprobs_mode="processed_logprobs"`` so logprobs are under the temperature-scaled
  distribution, the one the trainer's importance ratio compares against.
- Weight sync, two paths: full weights a bucket at a time through one buffer the trainer and vLLM's
  workers both map (``bridges.models.weight_buckets``: CUDA IPC on a GPU, so no tensor makes a host
  round trip; ``collective_rpc`` carries only the handle and the tensors' places, to
  ``WeightSyncExtension``), or, for a LoRA policy, the adapter saved to disk and hot-loaded as a new
  ``LoRARequest`` id each version (a running request keeps the adapter it started with).
- A full update is made the way vLLM expects it in flight: no new request enters the engine (our own
  gate: vLLM 0.26 queues requests made during a pause, 0.33 refuses them), ``pause_generation(mode=
  "wait")`` lets the running ones finish under the old weights, the weights load, the prefix cache is
  reset (its KV was computed with the old weights; vLLM returns False and does nothing while requests
  run, so the answer is checked, never ignored), generation resumes. Each sample's ``weight_version``
  is therefore the version every one of its tokens was sampled under.
- Outputs come back once, final (``RequestOutputKind.FINAL_ONLY``): the default re-sends the whole
  output at every engine step, quadratic in the length.
- Memory: ``gpu_memory_utilization`` defaults to what the trainer leaves free on the GPU less what its
  step will still take (``memory_utilization``; the step's floor for its dtype, strategy and adapter
  and its activations: ``bridges.grpo.step_memory``). ``vllm.enable_sleep_mode=true`` frees the engine's
  memory while the trainer steps (``asleep``), for colocated runs that alternate: full weights sleep at
  level 2 (discarded: the next update overwrites them, so they never make a host round trip), a LoRA
  engine's base weights at level 1 (kept on the host; only the adapter changes). The next update wakes
  it in the order that never holds two copies: free the trainer's cached blocks, wake the weights,
  load, then wake the KV cache (as TRL does).
The seam's vLLM calls are checked against the recorded APIs of vLLM 0.26 and 0.33
(``tests/support/vllm_api.json``, ``tests/adapters/test_vllm_releases.py``).
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

from bridges.envs.types import FinishReason, Sample, SamplingParams
from bridges.runtime.errors import ConfigError, EngineError, require_extra

GIB = 1024**3
RESET_TRIES = 5  # prefix-cache resets refused before the update is called failed


def engine_arguments(path: str, lora_rank: int, user: dict[str, Any]) -> dict[str, Any]:
    """The ``vllm.AsyncEngineArgs`` fields an engine over ``path`` is built with: ours, then the user's."""
    return {
        "model": path,
        "logprobs_mode": "processed_logprobs",
        "worker_extension_cls": "bridges.adapters.vllm.worker_extension.WeightSyncExtension",
        "gpu_memory_utilization": 0.5,  # for_training derives its own from what the trainer leaves free
        "enable_prefix_caching": True,
        **({"enable_lora": True, "max_lora_rank": lora_rank} if lora_rank > 0 else {}),
        **user,
    }


def sampling_kwargs(params: SamplingParams, n: int) -> dict[str, Any]:
    """Our ``SamplingParams`` as keyword arguments for ``vllm.SamplingParams``."""
    kwargs: dict[str, Any] = {
        "n": n,
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,
        "logprobs": params.top_logprobs,  # the sampled token's logprob, plus this many alternatives
        "skip_special_tokens": False,
        "include_stop_str_in_output": False,  # the client cuts at a stop string itself
    }
    return {**kwargs, **params.stops_and_seed()}


def samples_from_output(output: Any, weight_version: int, top_k: int = 0) -> list[Sample]:
    """A finished ``RequestOutput`` -> our ``Sample``s (one logprob per sampled id, or a clear error);
    ``top_k`` alternatives per position when the request asked for them."""
    samples = []
    for completion in output.outputs:
        token_ids = list(completion.token_ids)
        entries = completion.logprobs or []
        if len(entries) != len(token_ids):
            raise RuntimeError(
                f"vLLM returned {len(entries)} logprob entries for {len(token_ids)} sampled ids; "
                "the engine must be created with logprobs enabled."
            )
        logprobs = [float(entry[tok].logprob) for entry, tok in zip(entries, token_ids, strict=True)]
        top = [_top_entries(entry, top_k) for entry in entries] if top_k else None
        reason: FinishReason = (
            "stop"
            if completion.finish_reason == "stop"
            else "length"
            if completion.finish_reason == "length"
            else "abort"
        )
        stop_str = completion.stop_reason if isinstance(completion.stop_reason, str) else None
        samples.append(Sample(token_ids, logprobs, reason, weight_version, stop_str, top))
    return samples


def _top_entries(entry: dict[int, Any], k: int) -> list[tuple[int, float]]:
    """One position's ``{token_id: Logprob}`` -> its ``k`` best (id, logprob). vLLM adds the sampled id
    to the top-k when it ranks lower, so the dict may hold k + 1 entries: keep the k best."""
    ranked = sorted(entry.items(), key=lambda item: -float(item[1].logprob))
    return [(int(token), float(lp.logprob)) for token, lp in ranked[:k]]


class VLLMEngine:
    """An ``Engine`` over ``vllm.v1.engine.async_llm.AsyncLLM`` (GPU)."""

    name = "vllm"
    bucket_bytes = 512 << 20  # the shared buffer a full update is packed into, a bucket at a time

    def __init__(self, llm: Any, tokenizer: Any, *, max_model_len: int, lora: bool = False):
        self.llm = llm
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.weight_version = 0
        self._lora = lora
        self._lora_request: Any = None
        self._lora_ids = itertools.count(1)
        self._adapter_dir: Path | None = None  # made at the first LoRA sync, removed at close
        self._open = asyncio.Event()  # cleared while weights change: generate waits at it
        self._open.set()
        self._asleep = False
        self._weights_discarded = False  # asleep at level 2: only an update may wake the engine
        self._waking = asyncio.Lock()

    @classmethod
    def from_pretrained(cls, model: str, *, lora_rank: int = 0, **engine_args: Any) -> VLLMEngine:
        """``engine_args`` are ``vllm.AsyncEngineArgs`` fields (``vllm.*`` on the command line). Where the
        engine runs is vLLM's own business (``CUDA_VISIBLE_DEVICES``, ``tensor_parallel_size``): there is
        no device argument."""
        vllm = require_extra("vllm", "vllm", "the vLLM engine")
        from transformers import AutoTokenizer

        from bridges.models.tiny import resolve_model_path

        path = resolve_model_path(model)
        from vllm.v1.engine.async_llm import AsyncLLM

        llm = AsyncLLM.from_engine_args(vllm.AsyncEngineArgs(**engine_arguments(path, lora_rank, engine_args)))
        return cls(
            llm,
            AutoTokenizer.from_pretrained(path),
            max_model_len=llm.model_config.max_model_len,
            lora=lora_rank > 0,
        )

    @classmethod
    def for_training(cls, config: Any, where: Any, tokenizer: Any, reserve_bytes: int = 0) -> VLLMEngine:
        """The engine the GRPO trainer samples from, in the dtype the policy computes in (so the first
        importance ratio is 1); extra vLLM options come from ``vllm.*``. ``reserve_bytes``: what the
        trainer's step will still allocate (``bridges.grpo.step_memory.step_reserve_bytes``), kept out of
        vLLM's share of the GPU."""
        dtype = {"torch.bfloat16": "bfloat16", "torch.float16": "float16"}.get(str(where.dtype), "float32")
        user = dict(config.vllm)
        if "gpu_memory_utilization" not in user and where.device.type == "cuda":
            import torch

            free, total = torch.cuda.mem_get_info(where.device)
            user["gpu_memory_utilization"] = memory_utilization(free, total, reserve_bytes)
        return cls.from_pretrained(config.model, lora_rank=config.trainer.lora_rank, **{"dtype": dtype, **user})

    async def generate(self, prompt_ids: list[int], params: SamplingParams, n: int = 1) -> list[Sample]:
        vllm = require_extra("vllm", "vllm", "the vLLM engine")
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        await self._open.wait()  # no request enters vLLM while weights change
        if self._asleep:  # a step that did not update the weights leaves the engine asleep
            await self._wake()
        version = self.weight_version
        final = None
        async for output in self.llm.generate(
            TokensPrompt(prompt_token_ids=list(prompt_ids)),
            vllm.SamplingParams(**sampling_kwargs(params, n), output_kind=RequestOutputKind.FINAL_ONLY),
            request_id=uuid.uuid4().hex,
            lora_request=self._lora_request,
        ):
            final = output
        if final is None:
            raise RuntimeError("vLLM finished the request without producing an output.")
        return samples_from_output(final, version, params.top_logprobs)

    async def aupdate_weights(
        self, state_dict: dict[str, Any], policy: Any = None, version: int | None = None
    ) -> None:
        """New weights for the next requests: a LoRA hot-load when serving an adapter (a running request
        keeps its adapter), else full weights loaded while generation is paused (see the module doc);
        ``version`` numbers the update. Wakes a sleeping engine first."""
        self._open.clear()
        try:
            if self._lora and policy is not None:
                await self._wake()
                self._hot_load_adapter(policy)
            else:
                await self._load_paused(state_dict)
            self.weight_version = self.weight_version + 1 if version is None else version
        except EngineError:
            raise
        except Exception as exc:  # vLLM's own failure, as one sentence for the trainer to end on
            raise EngineError(f"vLLM failed to take new weights: {type(exc).__name__}: {exc}") from exc
        finally:
            self._open.set()

    def _hot_load_adapter(self, policy: Any) -> None:
        from vllm.lora.request import LoRARequest

        lora_id = next(self._lora_ids)
        if self._adapter_dir is None:
            self._adapter_dir = Path(tempfile.mkdtemp(prefix="bridges-lora-"))
        path = self._adapter_dir / f"v{lora_id}"
        policy.save_pretrained(path)
        self._lora_request = LoRARequest(f"policy-v{lora_id}", lora_id, str(path))

    async def _load_paused(self, state_dict: dict[str, Any]) -> None:
        """Wake the weights alone (asleep), pause (running requests finish first), load a bucket at a time,
        wake the KV cache, reset the prefix cache (checked), resume."""
        from bridges.models.weight_buckets import send_buckets

        asleep = self._asleep
        if asleep:
            _free_cached_blocks()  # the trainer's step left cached blocks: vLLM's wake must find them free
            await self.llm.wake_up(tags=["weights"])
        await self.llm.pause_generation(mode="wait")
        try:
            async def deliver(handle: Any, slots: list[Any]) -> None:
                await self.llm.collective_rpc("load_weight_bucket", args=(handle, slots))

            try:
                await send_buckets(state_dict.items(), deliver, self.bucket_bytes)
            finally:
                await self.llm.collective_rpc("close_weight_buffer")
            if asleep:
                await self.llm.wake_up(tags=["kv_cache"])
                self._asleep = self._weights_discarded = False
            for attempt in range(RESET_TRIES):
                if await self.llm.reset_prefix_cache():
                    return
                await asyncio.sleep(0.05 * (attempt + 1))
            raise EngineError(
                f"vLLM refused to reset its prefix cache {RESET_TRIES} times after a weight update (requests "
                "were still running), so cached prompts would be answered with the old weights; stopping."
            )
        finally:
            await self.llm.resume_generation()

    async def _wake(self) -> None:
        async with self._waking:  # concurrent requests wake it once
            if self._asleep:
                if self._weights_discarded:
                    raise EngineError(
                        "the vLLM engine slept at level 2 (its weights discarded) and was asked to generate "
                        "before new weights were loaded; the trainer pushes weights after every offload."
                    )
                _free_cached_blocks()
                await self.llm.wake_up()
                self._asleep = False

    async def asleep(self) -> bool:
        """Free the engine's GPU memory while the trainer steps (needs ``vllm.enable_sleep_mode=true``):
        level 2 for full weights (discarded, the next update overwrites them), level 1 for a LoRA engine
        (base weights to host memory). True when the weights were discarded, so the caller must push
        weights before the next rollout, stepped or not."""
        if not self._asleep:
            level = 1 if self._lora else 2
            await self.llm.sleep(level=level)
            self._asleep, self._weights_discarded = True, level == 2
        return self._weights_discarded

    async def aclose(self) -> None:
        self.llm.shutdown()
        if self._adapter_dir is not None:
            shutil.rmtree(self._adapter_dir, ignore_errors=True)


def _free_cached_blocks() -> None:
    """Hand the trainer's cached but unused allocator blocks back to the driver, so the memory vLLM's
    wake-up asks for is free for real (the caching allocator would otherwise keep it for the trainer)."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def memory_utilization(free_bytes: int, total_bytes: int, reserve_bytes: int) -> float:
    """vLLM's ``gpu_memory_utilization`` (its share of the whole GPU) for an engine started beside a
    trainer: what is free now, less what the trainer will still take (``reserve_bytes``), rounded
    down to a hundredth; one sentence when that leaves vLLM too little to hold a KV cache."""
    share = (free_bytes - reserve_bytes) / total_bytes
    if share < 0.05:
        raise ConfigError(
            f"the trainer leaves {free_bytes / GIB:.1f} GiB of this GPU's {total_bytes / GIB:.1f} GiB free and will "
            f"take {reserve_bytes / GIB:.1f} GiB more while it steps, too little for vLLM beside it; set "
            "vllm.enable_sleep_mode=true with trainer.num_batches_ahead=0, a smaller model or LoRA, or "
            "vllm.gpu_memory_utilization yourself."
        )
    return float(int(min(share, 0.95) * 100)) / 100
