"""The two engines the TRL adapter uses for vLLM, at the seams that run without a GPU.

``VLLMServerEngine`` talks to a real HTTP server speaking the same token-in/token-out
``/v1/completions`` contract as vLLM: ``bridges.serve`` on loopback, over the tiny model.
``VLLMColocateEngine`` drives an object with ``vllm.LLM.generate``'s signature that returns vLLM's
``RequestOutput`` shape; only the GPU library itself is stood in for.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bridges.adapters.vllm.colocate import VLLMColocateEngine
from bridges.adapters.vllm.server import VLLMServerEngine, completion_body
from bridges.envs.types import SamplingParams
from bridges.runtime.errors import EngineError


@pytest.fixture(scope="module")
def served(tiny_path: Path) -> Any:
    from bridges.adapters.hf import HFEngine
    from bridges.client import EngineClient
    from bridges.server.app import serve_in_thread

    engine = HFEngine.from_pretrained(str(tiny_path))
    server = serve_in_thread(EngineClient(engine, model_name="tiny"))
    try:
        yield server, engine
    finally:
        server.close()
        engine.close()


def test_request_body_asks_for_token_ids_and_sampled_logprobs():
    params = SamplingParams(max_tokens=5, temperature=0.7, top_p=0.9, top_k=3, stop=["x"], seed=4)
    assert completion_body("m", [1, 2], params, 2) == {
        "model": "m", "prompt": [1, 2], "n": 2, "max_tokens": 5, "temperature": 0.7, "top_p": 0.9,
        "logprobs": 0, "return_token_ids": True, "top_k": 3, "stop": ["x"], "seed": 4,
    }


async def test_server_engine_round_trips_token_ids_and_matches_the_engine(served: Any, tiny_tokenizer: Any):
    server, local = served
    engine = VLLMServerEngine(server.base_url, tiny_tokenizer, weight_version=7)
    prompt = tiny_tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True
    )["input_ids"]
    params = SamplingParams(max_tokens=6, temperature=0.0)
    try:
        remote = await engine.generate(prompt, params, n=2)
    finally:
        await engine.aclose()
    direct = await local.generate(prompt, params, n=1)
    assert engine.model == "tiny"  # found through /v1/models
    assert len(remote) == 2 and all(s.weight_version == 7 for s in remote)
    assert remote[0].token_ids == direct[0].token_ids  # greedy: the same ids as the engine behind the server
    assert remote[0].logprobs == pytest.approx(direct[0].logprobs, abs=1e-5)
    assert remote[0].finish_reason == direct[0].finish_reason


async def test_server_errors_are_one_sentence(served: Any, tiny_tokenizer: Any):
    server, _ = served
    engine = VLLMServerEngine(server.base_url, tiny_tokenizer, model="tiny")
    try:
        with pytest.raises(EngineError, match="answered 400"):
            await engine.generate([1, 2, 3], SamplingParams(max_tokens=0))
    finally:
        await engine.aclose()
    nobody = VLLMServerEngine("http://127.0.0.1:9", tiny_tokenizer, model="tiny", timeout=2)
    with pytest.raises(EngineError, match="did not answer"):
        await nobody.generate([1], SamplingParams(max_tokens=1))
    await nobody.aclose()


class StandInLLM:
    """``vllm.LLM.generate(prompts, sampling_params, use_tqdm=...)`` returning ``RequestOutput``s."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[int] = []
        self.fail = fail

    def generate(self, prompts: list[dict], sampling_params: list[Any], use_tqdm: bool = True) -> list[Any]:
        assert use_tqdm is False and len(prompts) == len(sampling_params)
        self.calls.append(len(prompts))
        if self.fail:
            raise RuntimeError("CUDA out of memory")
        outputs = []
        for prompt, params in zip(prompts, sampling_params, strict=True):
            last = prompt["prompt_token_ids"][-1]
            completions = [
                SimpleNamespace(
                    token_ids=[last + i, 2],
                    logprobs=[{last + i: SimpleNamespace(logprob=-0.5)}, {2: SimpleNamespace(logprob=-0.1)}],
                    finish_reason="stop",
                    stop_reason=None,
                )
                for i in range(params["n"])
            ]
            outputs.append(SimpleNamespace(outputs=completions))
        return outputs


def _inputs(prompts: list[list[int]], params: list[tuple[SamplingParams, int]]) -> tuple[list, list]:
    from bridges.adapters.vllm import sampling_kwargs

    return [{"prompt_token_ids": p} for p in prompts], [sampling_kwargs(sp, n) for sp, n in params]


async def test_colocate_engine_batches_concurrent_turns_into_one_generate_call(tiny_tokenizer: Any):
    llm = StandInLLM()
    engine = VLLMColocateEngine(llm, tiny_tokenizer, weight_version=3, build_inputs=_inputs)
    results = await asyncio.gather(
        *(engine.generate([10, 20 + i], SamplingParams(max_tokens=4), n=1 + i % 2) for i in range(5))
    )
    assert llm.calls == [5] and engine.batches == 1  # five rollouts' turns, one vLLM call
    for i, samples in enumerate(results):
        assert len(samples) == 1 + i % 2
        assert samples[0].token_ids == [20 + i, 2] and samples[0].logprobs == [-0.5, -0.1]
        assert samples[0].weight_version == 3
    again = await engine.generate([1], SamplingParams(max_tokens=2))
    assert again[0].token_ids == [1, 2] and llm.calls == [5, 1]


async def test_colocate_engine_failure_reaches_every_waiting_rollout(tiny_tokenizer: Any):
    engine = VLLMColocateEngine(StandInLLM(fail=True), tiny_tokenizer, build_inputs=_inputs)
    results = await asyncio.gather(
        *(engine.generate([i], SamplingParams()) for i in range(3)), return_exceptions=True
    )
    assert all(isinstance(r, RuntimeError) and "out of memory" in str(r) for r in results)
