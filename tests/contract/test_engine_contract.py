"""The engine contract: every engine passes the same checks at the token seam.

hf (transformers), paged (transformers' continuous batching), vLLM (``VLLMEngine`` with its real request and output conversion, over a stand-in
for the GPU-only ``AsyncLLM``: ``tests/support/vllm_standin.py``), verl's server seam
(``VerlServerEngine`` over our ``hf`` rollout server), Tinker (``TinkerEngine`` over the local
Tinker-compatible server, through the real SDK) and the fault-injecting test engine with no fault
planned. What every backend's trainer relies on: the
protocol's members, ``n`` samples of at most ``max_tokens`` ids with exactly one finite, non-positive
logprob each, a finish reason from the three allowed, the engine's weight version on every sample,
stop strings honoured, and a clean ``aclose``; trainable engines take new weights and bump their version.
"""

from __future__ import annotations

import math
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from bridges.envs.types import Engine, SamplingParams

KINDS = ["hf", "paged", "vllm", "verl", "tinker", "faulty"]


@pytest.fixture(scope="module")
def tinker_server(tiny_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from bridges.adapters.tinker.server import start_local_server

    saved = os.environ.get("TINKER_API_KEY")
    server = start_local_server(str(tiny_path), tmp_path_factory.mktemp("tinker"), model_name="tiny")
    try:
        yield server
    finally:
        server.close()
        if saved is None:
            os.environ.pop("TINKER_API_KEY", None)


def vllm_engine(tiny_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    import vllm_standin

    from bridges.adapters.vllm import VLLMEngine
    from bridges.runs.engines import load_engine

    vllm_standin.install(monkeypatch)
    hf = load_engine("hf", str(tiny_path))
    return VLLMEngine(vllm_standin.HFAsyncLLM(hf), hf.tokenizer, max_model_len=hf.max_model_len)


@pytest.fixture(params=KINDS)
async def engine(
    request: pytest.FixtureRequest, tiny_path: Path, tiny_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Any]:
    from bridges.runs.engines import load_engine

    kind = request.param
    if kind in ("hf", "paged"):
        built = load_engine(kind, str(tiny_path))
    elif kind == "vllm":
        built = vllm_engine(tiny_path, monkeypatch)
    elif kind == "faulty":
        from faulty_engine import FaultyEngine

        built = FaultyEngine(load_engine("hf", str(tiny_path)))
    elif kind == "verl":
        from bridges.adapters.verl.engine import VerlServerEngine
        from bridges.adapters.verl.hf_rollout import HFRolloutServer

        base = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}
        built = VerlServerEngine(HFRolloutServer(str(tiny_path)), tiny_tokenizer, base_sampling_params=base,
                                 response_length=1 << 30)
    else:
        import tinker

        from bridges.adapters.tinker.engine import TinkerEngine

        server = request.getfixturevalue("tinker_server")
        service = tinker.ServiceClient(base_url=server.url)
        sampler = await service.create_sampling_client(base_model="tiny")
        built = TinkerEngine(sampler, tiny_tokenizer)
    yield built
    await built.aclose()
    if kind == "tinker":
        from bridges.adapters.tinker.session import close_service

        close_service(service)


def prompt(tokenizer: Any) -> list[int]:
    return tokenizer.apply_chat_template([{"role": "user", "content": "abc"}], add_generation_prompt=True)[
        "input_ids"
    ]


async def test_every_engine_satisfies_the_protocol(engine: Any):
    assert isinstance(engine, Engine)
    assert isinstance(engine.name, str) and engine.name
    assert isinstance(engine.weight_version, int)
    assert engine.max_model_len is None or engine.max_model_len > 0


async def test_n_samples_with_one_finite_logprob_per_token(engine: Any):
    params = SamplingParams(max_tokens=5, temperature=1.0, seed=7)
    samples = await engine.generate(prompt(engine.tokenizer), params, n=3)
    assert len(samples) == 3
    for sample in samples:
        assert 0 < len(sample.token_ids) <= 5
        assert len(sample.logprobs) == len(sample.token_ids)
        assert all(math.isfinite(lp) and lp <= 1e-6 for lp in sample.logprobs)
        assert sample.finish_reason in ("stop", "length", "abort")
        assert sample.finish_reason == "length" or len(sample.token_ids) < 5 or sample.finish_reason == "stop"
        assert sample.weight_version == engine.weight_version
        assert all(isinstance(t, int) and 0 <= t < len(engine.tokenizer) for t in sample.token_ids)


async def test_top_logprobs_are_served_or_refused_in_one_sentence(engine: Any):
    """k alternatives per position, best first, from the distribution the sampled id's logprob comes
    from; or an ``UnsupportedRequestError`` before any work (Tinker's and verl's samplers)."""
    from bridges.runtime.errors import UnsupportedRequestError

    params = SamplingParams(max_tokens=4, temperature=1.0, seed=5, top_logprobs=3)
    try:
        [sample] = await engine.generate(prompt(engine.tokenizer), params)
    except UnsupportedRequestError as refused:
        assert str(refused).count(".") == 1 and "top_logprobs" in str(refused)
        return
    assert sample.top_logprobs is not None and len(sample.top_logprobs) == len(sample.token_ids)
    for token, logprob, top in zip(sample.token_ids, sample.logprobs, sample.top_logprobs, strict=True):
        values = [v for _, v in top]
        assert len(top) == 3 and values == sorted(values, reverse=True)
        if token in dict(top):
            assert dict(top)[token] == pytest.approx(logprob, abs=1e-5)
        else:
            assert logprob <= values[-1] + 1e-5


async def test_max_tokens_bounds_every_sample(engine: Any):
    for cap in (1, 3):
        samples = await engine.generate(prompt(engine.tokenizer), SamplingParams(max_tokens=cap, seed=1), n=2)
        assert all(1 <= len(s.token_ids) <= cap for s in samples)
        assert all(
            s.finish_reason == "length"
            for s in samples
            if len(s.token_ids) == cap and s.finish_reason != "stop"
        )


async def test_greedy_sampling_is_repeatable(engine: Any, tiny_path: Path, tiny_tokenizer: Any):
    if engine.name == "verl":  # verl's rollout config owns the sampling parameters: greedy is set there
        from bridges.adapters.verl.engine import VerlServerEngine
        from bridges.adapters.verl.hf_rollout import HFRolloutServer

        greedy = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "logprobs": True}
        engine = VerlServerEngine(HFRolloutServer(str(tiny_path)), tiny_tokenizer, base_sampling_params=greedy,
                                  response_length=1 << 30)
    params = SamplingParams(max_tokens=6, temperature=0.0)
    first = await engine.generate(prompt(engine.tokenizer), params)
    again = await engine.generate(prompt(engine.tokenizer), params)
    assert first[0].token_ids == again[0].token_ids


@pytest.mark.parametrize("kind", ["hf", "paged", "vllm", "faulty"])
async def test_trainable_engines_take_new_weights_and_bump_their_version(
    kind: str, tiny_path: Path, monkeypatch: pytest.MonkeyPatch
):
    import torch

    from bridges.envs.types import TrainableEngine
    from bridges.runs.engines import load_engine

    engine = (
        vllm_engine(tiny_path, monkeypatch)
        if kind == "vllm"
        else load_engine(kind.replace("faulty", "hf"), str(tiny_path))
    )
    if kind == "faulty":
        from faulty_engine import FaultyEngine

        engine = FaultyEngine(engine)
    assert isinstance(engine, TrainableEngine)
    model = {
        "hf": lambda: engine.model,
        "paged": lambda: engine.model,
        "faulty": lambda: engine.inner.model,
        "vllm": lambda: engine.llm.hf.model,
    }[kind]()
    greedy = SamplingParams(max_tokens=4, temperature=0.0)
    before, first = engine.weight_version, await engine.generate(prompt(engine.tokenizer), greedy)
    state = {k: torch.zeros_like(v) for k, v in model.state_dict().items() if "lm_head" in k or "embed" in k}
    await engine.aupdate_weights(state)
    samples = await engine.generate(prompt(engine.tokenizer), greedy)
    assert engine.weight_version == before + 1 == samples[0].weight_version
    # all-zero logits: every id is equally likely, so the new weights are the ones sampled from
    assert samples[0].logprobs == pytest.approx(
        [-math.log(len(engine.tokenizer))] * len(samples[0].logprobs), rel=1e-3
    )
    assert first[0].logprobs != samples[0].logprobs
    await engine.aclose()
