"""bridges.adapters.vllm at its CPU-testable seams (the engine itself is checked only on a GPU machine)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bridges.adapters.vllm import samples_from_output, sampling_kwargs
from bridges.envs.types import SamplingParams


def test_sampling_params_map_onto_vllm_arguments():
    params = SamplingParams(
        max_tokens=7, temperature=0.6, top_p=0.9, top_k=0, stop=["\n"], stop_token_ids=[2], seed=3
    )
    kwargs = sampling_kwargs(params, n=4)
    assert kwargs == {
        "n": 4, "max_tokens": 7, "temperature": 0.6, "top_p": 0.9, "top_k": -1, "logprobs": 0,
        "skip_special_tokens": False, "include_stop_str_in_output": False,
        "stop": ["\n"], "stop_token_ids": [2], "seed": 3,
    }


def _completion(ids, reason="stop", stop_reason=None, logprobs=True):
    entries = [{t: SimpleNamespace(logprob=-0.1 * (i + 1))} for i, t in enumerate(ids)] if logprobs else None
    return SimpleNamespace(token_ids=ids, logprobs=entries, finish_reason=reason, stop_reason=stop_reason)


def test_request_output_becomes_samples_with_one_logprob_per_id():
    output = SimpleNamespace(
        outputs=[_completion([5, 6, 2]), _completion([7], "length"), _completion([8], "abort")]
    )
    samples = samples_from_output(output, weight_version=3)
    assert [s.token_ids for s in samples] == [[5, 6, 2], [7], [8]]
    assert samples[0].logprobs == pytest.approx([-0.1, -0.2, -0.3])
    assert [s.finish_reason for s in samples] == ["stop", "length", "abort"]
    assert {s.weight_version for s in samples} == {3}
    stopped = samples_from_output(SimpleNamespace(outputs=[_completion([5], stop_reason="###")]), 0)
    assert stopped[0].stop_str == "###"


def test_missing_logprobs_is_a_clear_error():
    with pytest.raises(RuntimeError, match="logprob entries for 2 sampled ids"):
        samples_from_output(SimpleNamespace(outputs=[_completion([5, 6], logprobs=False)]), 0)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_module_imports_without_vllm_and_engine_names_the_extra():
    code = "import bridges.adapters.vllm, sys; assert 'vllm' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
    from bridges.adapters.vllm import VLLMEngine
    from bridges.runtime.errors import MissingExtraError

    with pytest.raises(MissingExtraError, match=r"pip install 'rl-bridges\[vllm\]'"):
        VLLMEngine.from_pretrained("tiny")


def test_top_logprobs_ask_vllm_for_alternatives_and_keep_the_best_k():
    assert sampling_kwargs(SamplingParams(top_logprobs=3), n=1)["logprobs"] == 3
    # vLLM returns the top k plus the sampled id when it ranks lower: k + 1 entries at that position
    lp = SimpleNamespace
    entries = [{9: lp(logprob=-0.1), 4: lp(logprob=-2.0), 5: lp(logprob=-3.0)},
               {6: lp(logprob=-4.0), 1: lp(logprob=-0.5), 3: lp(logprob=-1.0)}]
    completion = SimpleNamespace(token_ids=[9, 6], logprobs=entries, finish_reason="stop", stop_reason=None)
    [sample] = samples_from_output(SimpleNamespace(outputs=[completion]), 0, top_k=2)
    assert sample.logprobs == [-0.1, -4.0]
    assert sample.top_logprobs == [[(9, -0.1), (4, -2.0)], [(1, -0.5), (3, -1.0)]]
    [plain] = samples_from_output(SimpleNamespace(outputs=[completion]), 0)
    assert plain.top_logprobs is None


def test_engines_without_alternatives_refuse_top_logprobs_in_one_sentence():
    from bridges.adapters.tinker.engine import tinker_sampling_params
    from bridges.adapters.verl.engine import VerlServerEngine
    from bridges.runtime.errors import UnsupportedRequestError

    with pytest.raises(
        UnsupportedRequestError, match="^the Tinker engine returns only the sampled token's logprob"
    ):
        tinker_sampling_params(SamplingParams(top_logprobs=2), set())
    engine = object.__new__(VerlServerEngine)
    with pytest.raises(
        UnsupportedRequestError, match="^verl's rollout servers return only the sampled token's"
    ):
        asyncio.run(engine.generate([1, 2], SamplingParams(top_logprobs=2)))


def async_engine_args_fields() -> set[str]:
    """vLLM's own fields where it is installed, else those recorded from vLLM 0.33.0's wheel (vllm_api.json)."""
    if importlib.util.find_spec("vllm") is not None:
        import dataclasses

        import vllm

        return {f.name for f in dataclasses.fields(vllm.AsyncEngineArgs)}
    recorded = Path(__file__).resolve().parents[1] / "support" / "vllm_api.json"
    return set(json.loads(recorded.read_text())["0.33.0"]["engine_args"])


def test_every_argument_our_engines_hand_vllm_is_an_engine_args_field(monkeypatch: pytest.MonkeyPatch):
    """bridges.serve once passed device= through to AsyncEngineArgs, which has no such field."""
    from bridges.adapters.vllm.engine import VLLMEngine, engine_arguments
    from bridges.models.hardware import placement
    from bridges.runs.config import parse_config
    from bridges.runs.train_config import TrainConfig
    from bridges.server.run import ServeConfig, engine_options

    fields = async_engine_args_fields()
    assert {"model", "dtype", "enable_lora", "gpu_memory_utilization"} <= fields and "device" not in fields
    built: list[dict] = []  # what from_pretrained would hand AsyncEngineArgs (it needs a GPU to go further)
    monkeypatch.setattr(VLLMEngine, "from_pretrained", classmethod(
        lambda cls, model, lora_rank=0, **user: built.append(engine_arguments(model, lora_rank, user))))
    serve_options = engine_options(parse_config(ServeConfig, ["engine=vllm"]))
    VLLMEngine.from_pretrained("tiny", lora_rank=0, **serve_options)
    config = parse_config(TrainConfig, ["engine=vllm", "trainer.lora_rank=8", "vllm.max_model_len=2048"])
    VLLMEngine.for_training(config, placement("cpu", "bf16"), None)
    assert len(built) == 2 and built[1]["dtype"] == "bfloat16" and built[1]["max_lora_rank"] == 8
    for arguments in built:
        assert set(arguments) <= fields, set(arguments) - fields


async def test_an_engine_leaves_no_folder_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_tokenizer: Any):
    """The LoRA adapter folder is made at the first LoRA sync only, and removed at close."""
    import tempfile

    from bridges.adapters.vllm.engine import VLLMEngine

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    class StoppedLLM:
        def shutdown(self) -> None:
            return None

    for lora in (False, True):
        engine = VLLMEngine(StoppedLLM(), tiny_tokenizer, max_model_len=64, lora=lora)
        await engine.aclose()
    assert list(tmp_path.iterdir()) == []
