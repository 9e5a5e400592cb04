"""bridges.adapters.vllm at its CPU-testable seams (the engine itself is checked only on a GPU machine)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from types import SimpleNamespace

import pytest

from bridges.adapters.vllm import samples_from_output, sampling_kwargs
from bridges.types import SamplingParams


def test_sampling_params_map_onto_vllm_arguments():
    params = SamplingParams(
        max_tokens=7, temperature=0.6, top_p=0.9, top_k=0, stop=["\n"], stop_token_ids=[2], seed=3
    )
    kwargs = sampling_kwargs(params, n=4)
    assert kwargs == {
        "n": 4, "max_tokens": 7, "temperature": 0.6, "top_p": 0.9, "top_k": -1, "logprobs": 0,
        "skip_special_tokens": False, "include_stop_str_in_output": False,
        "stop": ["\n"], "stop_token_ids": [2], "seed": 3,
    }  # fmt: skip


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
    code = "import adapters.vllm, sys; assert 'vllm' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
    from bridges.adapters.vllm import VLLMEngine
    from bridges.errors import MissingExtraError

    with pytest.raises(MissingExtraError, match=r"pip install 'rl-bridges\[vllm\]'"):
        VLLMEngine.from_pretrained("tiny")
