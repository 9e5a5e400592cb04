"""A stand-in for vLLM's ``AsyncLLM`` on this CPU, so ``VLLMEngine`` runs the engine contract.

vLLM needs a GPU, so what cannot run here is replaced at exactly the seam ``VLLMEngine`` uses, and
nothing above it: ``AsyncLLM.generate`` (a ``TokensPrompt`` and a ``vllm.SamplingParams`` in, a
stream of ``RequestOutput``s out, logprobs as ``{token_id: Logprob}`` per position) is answered by
our transformers engine over the same weights; ``collective_rpc("update_weights_from_state")``
calls our real ``WeightSyncExtension`` on a worker whose model loads Hugging Face names, as vLLM's
models do. The request conversion (``sampling_kwargs``) and output conversion
(``samples_from_output``) under test are the real ones.
"""

from __future__ import annotations

import sys
import types
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

from bridges.adapters.vllm.worker_extension import WeightSyncExtension
from bridges.envs.types import SamplingParams


def vllm_module() -> types.ModuleType:
    """The two names ``VLLMEngine.generate`` imports: ``vllm.SamplingParams`` and ``vllm.inputs.TokensPrompt``."""
    vllm = types.ModuleType("vllm")
    inputs = types.ModuleType("vllm.inputs")
    vllm.SamplingParams = lambda **kwargs: SimpleNamespace(**kwargs)  # type: ignore[attr-defined]
    inputs.TokensPrompt = dict  # type: ignore[attr-defined]
    vllm.inputs = inputs  # type: ignore[attr-defined]
    return vllm


def install(monkeypatch: Any) -> None:
    vllm = vllm_module()
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.inputs", vllm.inputs)


class _LoadsHFNames:
    """A vLLM model's ``load_weights`` contract over a transformers model."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def parameters(self) -> Any:
        return self.model.parameters()

    def load_weights(self, weights: list[tuple[str, Any]]) -> None:
        missing = set(dict(weights)) - set(self.model.state_dict())
        assert not missing, f"unknown parameter names {sorted(missing)[:3]}"
        self.model.load_state_dict(dict(weights), strict=False)


class _Worker(WeightSyncExtension):
    def __init__(self, model: Any) -> None:
        self.model_runner = SimpleNamespace(model=_LoadsHFNames(model))


def _position(token: int, logprob: float, top: list[tuple[int, float]]) -> dict[int, Any]:
    """One position as vLLM returns it: the top-k alternatives plus the sampled id (k + 1 entries
    when the sampled id ranks below the top k)."""
    entry = {t: SimpleNamespace(logprob=lp) for t, lp in top}
    entry[token] = SimpleNamespace(logprob=logprob)
    return entry


class HFAsyncLLM:
    """``AsyncLLM``'s generate / collective_rpc / reset_prefix_cache / shutdown over an ``HFEngine``."""

    def __init__(self, hf_engine: Any) -> None:
        self.hf = hf_engine
        self.worker = _Worker(hf_engine.model)
        self.requests: list[dict[str, Any]] = []  # every vllm.SamplingParams as VLLMEngine built it

    async def generate(self, prompt: dict[str, Any], sampling_params: Any, request_id: str,
                       lora_request: Any = None) -> AsyncIterator[Any]:  # fmt: skip
        kw = vars(sampling_params)
        self.requests.append(dict(kw))
        assert kw["n"] >= 1 and request_id
        params = SamplingParams(max_tokens=kw["max_tokens"], temperature=kw["temperature"], top_p=kw["top_p"],
                                top_k=max(0, kw["top_k"]), stop=kw.get("stop") or [],
                                stop_token_ids=kw.get("stop_token_ids") or [], seed=kw.get("seed"),
                                top_logprobs=kw["logprobs"])  # fmt: skip
        samples = await self.hf.generate(list(prompt["prompt_token_ids"]), params, kw["n"])
        outputs = [
            SimpleNamespace(
                token_ids=s.token_ids,
                logprobs=[
                    _position(t, lp, s.top_logprobs[i] if s.top_logprobs else [])
                    for i, (t, lp) in enumerate(zip(s.token_ids, s.logprobs, strict=True))
                ],  # fmt: skip
                finish_reason=s.finish_reason,
                stop_reason=s.stop_str,
            )
            for s in samples
        ]
        yield SimpleNamespace(outputs=outputs, finished=True)

    async def collective_rpc(self, method: str, args: tuple[Any, ...] = ()) -> list[Any]:
        return [getattr(self.worker, method)(*args)]

    async def reset_prefix_cache(self) -> None:
        return None

    def shutdown(self) -> None:
        self.hf.close()
