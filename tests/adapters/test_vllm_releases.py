"""The vLLM engine against the recorded APIs of two releases (0.26.x, on torch 2.11, and 0.33.x, on torch
2.14; ``tests/support/vllm_api.json``, read from their wheels): every call fits the release's signatures,
weight updates land the way vLLM expects them in flight (pause, load, a checked prefix-cache reset,
resume), each sample's weight_version is the version all its tokens were sampled under, outputs come
back final-only, sleep mode offloads while the trainer steps, and the memory share is derived from what
the trainer leaves free. vLLM needs a GPU: the stand-in answers at the seam (``vllm_standin``)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

SUPPORT = Path(__file__).resolve().parents[1] / "support"
sys.path.insert(0, str(SUPPORT))

import vllm_standin  # noqa: E402

from bridges.envs.types import SamplingParams  # noqa: E402

RELEASES = vllm_standin.releases()


def test_both_releases_are_recorded_and_differ_where_the_engine_must_cope():
    assert set(RELEASES) == {"0.26.0", "0.33.0"}
    assert RELEASES["0.26.0"]["requests_made_while_paused"] == "queued"
    assert RELEASES["0.33.0"]["requests_made_while_paused"] == "refused"
    for record in RELEASES.values():
        assert "wait" in record["pause_modes"] and "FINAL_ONLY" in record["request_output_kinds"]
        assert record["async_llm"]["reset_prefix_cache"]["returns"] == "bool"


def engine_on(release: str, hf: Any, monkeypatch: pytest.MonkeyPatch, **standin: Any) -> Any:
    from bridges.adapters.vllm import VLLMEngine

    record = RELEASES[release]
    vllm_standin.install_release(monkeypatch, record)
    llm = vllm_standin.ReleaseAsyncLLM(hf, record, **standin)
    return VLLMEngine(llm, hf.tokenizer, max_model_len=hf.max_model_len), llm


@pytest.fixture
def hf(tiny_path: Path) -> Any:
    from bridges.runs.engines import load_engine

    engine = load_engine("hf", str(tiny_path))
    yield engine
    engine.close()


@pytest.mark.parametrize("release", sorted(RELEASES))
async def test_updates_in_flight_keep_every_samples_version_exact(release: str, hf: Any, monkeypatch: pytest.MonkeyPatch):
    engine, llm = engine_on(release, hf, monkeypatch)
    params = SamplingParams(max_tokens=6, temperature=1.0)
    weights = {k: v.clone() for k, v in hf.model.state_dict().items()}

    async def updates() -> None:
        for _ in range(3):
            await asyncio.sleep(0.01)
            await engine.aupdate_weights(weights)

    results = await asyncio.gather(*(engine.generate([5, 6, 7], params, n=2) for _ in range(12)), updates(),
                                   *(engine.generate([8, 9], params) for _ in range(4)))
    samples = [s for r in results if r for s in r]
    assert len(samples) == 12 * 2 + 4 and engine.weight_version == 3 == llm.updates
    # every request started and ended under one version, and its samples carry exactly that version
    assert all(start == end for start, end in llm.spans), llm.spans
    versions_by_span = sorted(start for start, _ in llm.spans)
    assert sorted({s.weight_version for s in samples}) == sorted(set(versions_by_span))
    assert llm.calls == ["pause:wait", "load", "close", "reset", "resume"] * 3
    assert all(r["output_kind"].name == "FINAL_ONLY" for r in llm.requests)


@pytest.mark.parametrize("release", sorted(RELEASES))
async def test_a_refused_prefix_cache_reset_is_never_ignored(release: str, hf: Any, monkeypatch: pytest.MonkeyPatch):
    from bridges.runtime.errors import EngineError

    engine, llm = engine_on(release, hf, monkeypatch, refuse_resets=2)
    await engine.aupdate_weights(dict(hf.model.state_dict()))  # refused twice, then reset: the update lands
    assert llm.calls == ["pause:wait", "load", "close", "reset:refused", "reset:refused", "reset", "resume"]
    llm.refuse_resets, llm.calls = 100, []
    with pytest.raises(EngineError, match="^vLLM refused to reset its prefix cache 5 times after a weight update"):
        await engine.aupdate_weights(dict(hf.model.state_dict()))
    assert llm.calls[-1] == "resume" and engine.weight_version == 1  # generation resumed; version not advanced
    [sample] = await engine.generate([5, 6], SamplingParams(max_tokens=3))
    assert sample.weight_version == 1
    with pytest.raises(EngineError, match=r"^vLLM failed to take new weights: AssertionError: unknown parameter names"):
        await engine.aupdate_weights({"no.such.weight": torch.zeros(1)})  # the worker's load_weights raises
    assert llm.calls[-1] == "resume" and engine.weight_version == 1


@pytest.mark.parametrize("release", sorted(RELEASES))
async def test_sleep_mode_discards_full_weights_and_wakes_them_before_the_cache(release: str, hf: Any,
                                                                               monkeypatch: pytest.MonkeyPatch):
    from bridges.runtime.errors import EngineError

    engine, llm = engine_on(release, hf, monkeypatch)
    assert await engine.asleep() and await engine.asleep()  # discarded: the trainer must push; twice is once
    assert llm.asleep and llm.calls == ["sleep:2"]
    with pytest.raises(EngineError, match="slept at level 2 .* asked to generate before new weights were loaded"):
        await engine.generate([5, 6], SamplingParams(max_tokens=3))
    await engine.aupdate_weights(dict(hf.model.state_dict()))
    # the weights alone come back and are loaded before the KV cache is woken: never two copies at once
    assert llm.calls == ["sleep:2", "wake:weights", "pause:wait", "load", "close", "wake:kv_cache", "reset", "resume"]
    assert not llm.asleep
    [sample] = await engine.generate([5, 6], SamplingParams(max_tokens=3))
    assert sample.weight_version == 1


@pytest.mark.parametrize("release", sorted(RELEASES))
async def test_a_lora_engine_sleeps_at_level_one_and_wakes_once_for_many_requests(release: str, hf: Any,
                                                                                  monkeypatch: pytest.MonkeyPatch):
    from bridges.adapters.vllm import VLLMEngine

    vllm_standin.install_release(monkeypatch, RELEASES[release])
    llm = vllm_standin.ReleaseAsyncLLM(hf, RELEASES[release])
    engine = VLLMEngine(llm, hf.tokenizer, max_model_len=hf.max_model_len, lora=True)
    assert await engine.asleep() is False  # base weights kept on the host: a skipped step needs no push
    assert llm.calls == ["sleep:1"]
    results = await asyncio.gather(*(engine.generate([5, 6], SamplingParams(max_tokens=3)) for _ in range(4)))
    assert llm.calls == ["sleep:1", "wake"] and not llm.asleep and {s.weight_version for [s] in results} == {0}


@pytest.mark.parametrize("release", sorted(RELEASES))
async def test_full_weights_reach_the_worker_through_the_shared_buffer_not_the_pipe(
        release: str, hf: Any, monkeypatch: pytest.MonkeyPatch):
    engine, llm = engine_on(release, hf, monkeypatch)
    sent: list[Any] = []
    real_rpc = vllm_standin.HFAsyncLLM.collective_rpc

    async def recording(self: Any, method: str, args: tuple[Any, ...] = ()) -> list[Any]:
        sent.append(args)
        return await real_rpc(self, method, args)
    monkeypatch.setattr(vllm_standin.HFAsyncLLM, "collective_rpc", recording)
    engine.bucket_bytes = 4096  # several buckets for the tiny model
    new = {k: v + 0.25 for k, v in hf.model.state_dict().items()}
    await engine.aupdate_weights(new)
    assert all(torch.equal(hf.model.state_dict()[k], v) for k, v in new.items())  # every tensor landed
    loads = [a for a in sent if a]
    assert len(loads) > 1 and not any(isinstance(x, torch.Tensor) for a in loads for x in a)  # handles only
    assert loads[0][0].shm_name and sum(len(slots) for _, slots in loads) == len(new)


@pytest.mark.parametrize("release", sorted(RELEASES))
def test_every_engine_argument_is_a_field_of_the_release(release: str, monkeypatch: pytest.MonkeyPatch):
    from bridges.adapters.vllm.engine import VLLMEngine, engine_arguments
    from bridges.models.hardware import Placement
    from bridges.runs.config import parse_config
    from bridges.runs.train_config import TrainConfig

    built: list[dict] = []
    monkeypatch.setattr(VLLMEngine, "from_pretrained", classmethod(
        lambda cls, model, lora_rank=0, **user: built.append(engine_arguments(model, lora_rank, user))))
    gib = 1024**3
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (60 * gib, 80 * gib))  # faked at the seam
    config = parse_config(TrainConfig, ["engine=vllm", "vllm.enable_sleep_mode=true", "trainer.num_batches_ahead=0"])
    VLLMEngine.for_training(config, Placement(torch.device("cuda:0"), torch.bfloat16, "sdpa"), None, 8 * gib)
    fields = set(RELEASES[release]["engine_args"])
    assert set(built[0]) <= fields, set(built[0]) - fields
    # 60 GiB free of 80, the 8 GiB the trainer's step will still allocate kept out
    assert built[0]["gpu_memory_utilization"] == 0.65 and built[0]["enable_sleep_mode"] is True


def test_the_memory_share_is_what_the_trainer_leaves_free_or_one_sentence():
    from bridges.adapters.vllm.engine import memory_utilization
    from bridges.runtime.errors import ConfigError

    gib = 1024**3
    assert memory_utilization(70 * gib, 80 * gib, 10 * gib) == 0.75
    assert memory_utilization(80 * gib, 80 * gib, 0) == 0.95  # never the whole GPU
    with pytest.raises(ConfigError, match=r"leaves 5\.0 GiB of this GPU's 80\.0 GiB free and will take 4\.0 GiB more"):
        memory_utilization(5 * gib, 80 * gib, 4 * gib)


@pytest.mark.parametrize("setting", [["engine=hf"], ["engine=vllm", "trainer.num_batches_ahead=1"],
                                     ["engine=vllm", "trainer.num_batches_ahead=0", "trainer.inference=server",
                                      "trainer.server_urls=[http://127.0.0.1:9]"]])
def test_sleep_mode_where_something_generates_during_a_step_is_one_sentence(setting: list[str], capsys):
    from bridges.runs.config import run_cli
    from bridges.train import main

    with pytest.raises(SystemExit) as exit_info:
        run_cli(main, ["vllm.enable_sleep_mode=true", *setting, "dry_run=true"])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1, err
    assert "vllm.enable_sleep_mode=true offloads the vLLM engine while the trainer steps" in err
