"""``VLLMEngine``: vLLM's in-process ``AsyncLLM`` behind the token-level ``Engine`` seam.

Checked only on a GPU machine: vLLM needs CUDA, so CPU CI tests the pure conversions here
(``sampling_kwargs``, ``samples_from_output``) and that this module imports without vLLM.

- Token in, token out: prompts go in as ``TokensPrompt(prompt_token_ids=...)``; the sampled ids
  and the logprob of each sampled id come back unchanged (``logprobs=0``). The engine is built with
  ``logprobs_mode="processed_logprobs"`` so logprobs are under the temperature-scaled
  distribution, the one the trainer's importance ratio compares against.
- Weight sync, two paths: full weights through ``collective_rpc`` into ``WeightSyncExtension``
  (then the prefix cache is reset, since cached KV was computed with the old weights), or, for a
  LoRA policy, the adapter saved to disk and hot-loaded as a new ``LoRARequest`` id each version.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

from bridges.envs.types import FinishReason, Sample, SamplingParams
from bridges.runtime.errors import require_extra


def engine_arguments(path: str, lora_rank: int, user: dict[str, Any]) -> dict[str, Any]:
    """The ``vllm.AsyncEngineArgs`` fields an engine over ``path`` is built with: ours, then the user's."""
    return {
        "model": path,
        "logprobs_mode": "processed_logprobs",
        "worker_extension_cls": "bridges.adapters.vllm.worker_extension.WeightSyncExtension",
        "gpu_memory_utilization": 0.5,  # leave room for the trainer on the same GPU
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

    def __init__(self, llm: Any, tokenizer: Any, *, max_model_len: int, lora: bool = False):
        self.llm = llm
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.weight_version = 0
        self._lora = lora
        self._lora_request: Any = None
        self._lora_ids = itertools.count(1)
        self._adapter_dir: Path | None = None  # made at the first LoRA sync, removed at close

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
    def for_training(cls, config: Any, where: Any, tokenizer: Any) -> VLLMEngine:
        """The engine the GRPO trainer samples from, in the dtype the policy computes in (so the first
        importance ratio is 1); extra vLLM options come from ``vllm.*``."""
        dtype = {"torch.bfloat16": "bfloat16", "torch.float16": "float16"}.get(str(where.dtype), "float32")
        return cls.from_pretrained(config.model, lora_rank=config.trainer.lora_rank,
                                   **{"dtype": dtype, **dict(config.vllm)})  # fmt: skip

    async def generate(self, prompt_ids: list[int], params: SamplingParams, n: int = 1) -> list[Sample]:
        vllm = require_extra("vllm", "vllm", "the vLLM engine")
        from vllm.inputs import TokensPrompt

        version = self.weight_version
        final = None
        async for output in self.llm.generate(
            TokensPrompt(prompt_token_ids=list(prompt_ids)),
            vllm.SamplingParams(**sampling_kwargs(params, n)),
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
        """New weights for the next requests: LoRA hot-load when serving an adapter, else full weights.
        A request already running keeps the version it started under (vLLM swaps weights between its
        engine steps, so its later tokens may come from the new ones); ``version`` numbers the update."""
        if self._lora and policy is not None:
            from vllm.lora.request import LoRARequest

            lora_id = next(self._lora_ids)
            if self._adapter_dir is None:
                self._adapter_dir = Path(tempfile.mkdtemp(prefix="bridges-lora-"))
            path = self._adapter_dir / f"v{lora_id}"
            policy.save_pretrained(path)
            self._lora_request = LoRARequest(f"policy-v{lora_id}", lora_id, str(path))
        else:
            named = [(name, tensor.detach().cpu()) for name, tensor in state_dict.items()]
            await self.llm.collective_rpc("update_weights_from_state", args=(named,))
            await self.llm.reset_prefix_cache()
        self.weight_version = self.weight_version + 1 if version is None else version

    async def aclose(self) -> None:
        self.llm.shutdown()
        if self._adapter_dir is not None:
            shutil.rmtree(self._adapter_dir, ignore_errors=True)
