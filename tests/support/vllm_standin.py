"""A stand-in for vLLM's ``AsyncLLM`` on this CPU, so ``VLLMEngine`` runs the engine contract.

vLLM needs a GPU, so what cannot run here is replaced at exactly the seam ``VLLMEngine`` uses, and
nothing above it: ``AsyncLLM.generate`` (a ``TokensPrompt`` and a ``vllm.SamplingParams`` in, a
stream of ``RequestOutput``s out, logprobs as ``{token_id: Logprob}`` per position) is answered by
our transformers engine over the same weights; ``collective_rpc("load_weight_bucket")`` calls our real
``WeightSyncExtension`` on a worker whose model loads Hugging Face names, as vLLM's models do, reading
the trainer's shared buffer (shared memory on the CPU, the path CUDA IPC takes on a GPU). The request conversion (``sampling_kwargs``) and output conversion
(``samples_from_output``) under test are the real ones.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import json
import sys
import types
from collections.abc import AsyncIterator
from pathlib import Path
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
    sampling = types.ModuleType("vllm.sampling_params")
    sampling.RequestOutputKind = enum.Enum("RequestOutputKind", ["CUMULATIVE", "DELTA", "FINAL_ONLY"])  # type: ignore[attr-defined]
    vllm.sampling_params = sampling  # type: ignore[attr-defined]
    return vllm


def install(monkeypatch: Any) -> None:
    vllm = vllm_module()
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.inputs", vllm.inputs)
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", vllm.sampling_params)


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
    """``AsyncLLM``'s generate / collective_rpc / pause and resume / reset_prefix_cache / shutdown over an
    ``HFEngine`` (``ReleaseAsyncLLM`` below holds it to a recorded release's signatures and behaviour)."""

    def __init__(self, hf_engine: Any) -> None:
        self.hf = hf_engine
        self.worker = _Worker(hf_engine.model)
        self.requests: list[dict[str, Any]] = []  # every vllm.SamplingParams as VLLMEngine built it

    async def generate(self, prompt: dict[str, Any], sampling_params: Any, request_id: str,
                       lora_request: Any = None) -> AsyncIterator[Any]:
        kw = vars(sampling_params)
        self.requests.append(dict(kw))
        assert kw["n"] >= 1 and request_id
        params = SamplingParams(max_tokens=kw["max_tokens"], temperature=kw["temperature"], top_p=kw["top_p"],
                                top_k=max(0, kw["top_k"]), stop=kw.get("stop") or [],
                                stop_token_ids=kw.get("stop_token_ids") or [], seed=kw.get("seed"),
                                top_logprobs=kw["logprobs"])
        samples = await self.hf.generate(list(prompt["prompt_token_ids"]), params, kw["n"])
        outputs = [
            SimpleNamespace(
                token_ids=s.token_ids,
                logprobs=[
                    _position(t, lp, s.top_logprobs[i] if s.top_logprobs else [])
                    for i, (t, lp) in enumerate(zip(s.token_ids, s.logprobs, strict=True))
                ],
                finish_reason=s.finish_reason,
                stop_reason=s.stop_str,
            )
            for s in samples
        ]
        yield SimpleNamespace(outputs=outputs, finished=True)

    async def collective_rpc(self, method: str, args: tuple[Any, ...] = ()) -> list[Any]:
        import pickle

        args = pickle.loads(pickle.dumps(args))  # what crosses to vLLM's worker processes is pickled
        return [getattr(self.worker, method)(*args)]

    async def pause_generation(self, *, mode: str = "abort", clear_cache: bool = True) -> None:
        return None

    async def resume_generation(self) -> None:
        return None

    async def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        return True

    def shutdown(self) -> None:
        self.hf.close()


# --------------------------------------------------------------------------------------------------
# A stand-in that follows one recorded vLLM release (tests/support/vllm_api.json)

RECORD = Path(__file__).resolve().parent / "vllm_api.json"


def releases() -> dict[str, Any]:
    return json.loads(RECORD.read_text())


class RetryableRequestError(RuntimeError):
    """What vLLM 0.33 raises for a request made while generation is paused."""


def _checked(record: dict[str, Any], name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """The call binds to the release's recorded signature of ``AsyncLLM.<name>``, or AssertionError."""
    spec = record["async_llm"][name]
    params = [inspect.Parameter(p, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                default=None if p in spec["defaults"] else inspect.Parameter.empty)
              for p in spec["positional"]]
    params += [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=None) for k in spec["keyword_only"]]
    try:
        inspect.Signature(params).bind(*args, **kwargs)
    except TypeError as exc:
        raise AssertionError(f"AsyncLLM.{name}{args, kwargs} does not fit vLLM's recorded signature: {exc}") from exc


def release_module(record: dict[str, Any]) -> types.ModuleType:
    """``vllm`` with the names the engine imports, its ``SamplingParams`` refusing fields the release lacks."""
    vllm = vllm_module()
    fields = set(record["sampling_params"])

    def sampling_params(**kwargs: Any) -> Any:
        unknown = set(kwargs) - fields
        assert not unknown, f"SamplingParams has no field(s) {sorted(unknown)} in this release"
        return SimpleNamespace(**kwargs)

    vllm.SamplingParams = sampling_params  # type: ignore[attr-defined]
    module = types.ModuleType("vllm.sampling_params")
    module.RequestOutputKind = enum.Enum("RequestOutputKind", record["request_output_kinds"])  # type: ignore[attr-defined]
    vllm.sampling_params = module  # type: ignore[attr-defined]
    return vllm


def install_release(monkeypatch: Any, record: dict[str, Any]) -> None:
    vllm = release_module(record)
    for name, module in (("vllm", vllm), ("vllm.inputs", vllm.inputs), ("vllm.sampling_params", vllm.sampling_params)):
        monkeypatch.setitem(sys.modules, name, module)


class ReleaseAsyncLLM(HFAsyncLLM):
    """``HFAsyncLLM`` held to one release: every call checked against its recorded signature; pauses as it
    documents them (``wait`` drains the running requests; a request made while paused is queued by 0.26
    and refused by 0.33); ``reset_prefix_cache`` refuses (False) while a request runs, or ``refuse_resets``
    times; sleep mode. ``spans`` records, per request, the weight updates loaded at its start and its end."""

    def __init__(self, hf_engine: Any, record: dict[str, Any], *, hold_s: float = 0.02, refuse_resets: int = 0) -> None:
        super().__init__(hf_engine)
        self.record, self.hold_s, self.refuse_resets = record, hold_s, refuse_resets
        self.running = 0
        self.paused = self.asleep = False
        self.awake_tags: set[str] = set()
        self.updates = 0  # weight loads so far
        self.spans: list[tuple[int, int]] = []
        self.calls: list[str] = []
        self._resumed = asyncio.Event()
        self._resumed.set()

    async def generate(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:  # type: ignore[override]
        _checked(self.record, "generate", args, kwargs)
        assert not self.asleep, "generate on a sleeping engine"
        if self.paused:
            if self.record["requests_made_while_paused"] == "refused":
                raise RetryableRequestError("generation is paused")
            await self._resumed.wait()
        self.running += 1
        start = self.updates
        try:
            await asyncio.sleep(self.hold_s)  # in flight for a while, so updates can arrive meanwhile
            async for output in super().generate(*args, **kwargs):
                await asyncio.sleep(self.hold_s)
                self.spans.append((start, self.updates))
                yield output
        finally:
            self.running -= 1

    async def pause_generation(self, *args: Any, **kwargs: Any) -> None:
        _checked(self.record, "pause_generation", args, kwargs)
        self.calls.append(f"pause:{kwargs.get('mode', 'abort')}")
        assert kwargs.get("mode") in self.record["pause_modes"]
        self.paused = True
        self._resumed.clear()
        while kwargs.get("mode") == "wait" and self.running:
            await asyncio.sleep(0.001)

    async def resume_generation(self, *args: Any, **kwargs: Any) -> None:
        _checked(self.record, "resume_generation", args, kwargs)
        self.calls.append("resume")
        self.paused = False
        self._resumed.set()

    async def collective_rpc(self, *args: Any, **kwargs: Any) -> list[Any]:  # type: ignore[override]
        _checked(self.record, "collective_rpc", args, kwargs)
        assert not self.asleep or self.awake_tags == {"weights"}, "weights loaded into a sleeping engine"
        self.calls.append({"load_weight_bucket": "load", "close_weight_buffer": "close"}[args[0]])
        result = await super().collective_rpc(args[0], kwargs.get("args", ()))
        self.updates += args[0] == "close_weight_buffer"  # one update: its buckets, then the close
        return result

    async def reset_prefix_cache(self, *args: Any, **kwargs: Any) -> bool:  # type: ignore[override]
        _checked(self.record, "reset_prefix_cache", args, kwargs)
        if self.running or self.refuse_resets > 0:
            self.refuse_resets -= 1
            self.calls.append("reset:refused")
            return False
        self.calls.append("reset")
        return True

    async def sleep(self, *args: Any, **kwargs: Any) -> None:
        _checked(self.record, "sleep", args, kwargs)
        level = kwargs.get("level", args[0] if args else 1)
        self.calls.append(f"sleep:{level}")
        self.asleep, self.awake_tags = True, set()

    async def wake_up(self, *args: Any, **kwargs: Any) -> Any:
        """vLLM wakes the weights, the KV cache, or (no tags) both; the engine is awake once both are."""
        _checked(self.record, "wake_up", args, kwargs)
        tags = kwargs.get("tags", args[0] if args else None)
        self.calls.append("wake" if tags is None else f"wake:{','.join(tags)}")
        self.awake_tags |= {"weights", "kv_cache"} if tags is None else set(tags)
        self.asleep = self.awake_tags != {"weights", "kv_cache"}
        return True if self.record["async_llm"]["wake_up"]["returns"] == "bool" else None

    def shutdown(self, *args: Any, **kwargs: Any) -> None:
        _checked(self.record, "shutdown", args, kwargs)
        super().shutdown()
