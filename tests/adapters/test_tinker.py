"""The real tinker 0.38 SDK over HTTP against the local Tinker server (tiny model, CPU).

Every number the server returns is checked against a direct torch computation on the same weights:
the saved state's LoRA tensors loaded into a fresh peft model built here.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tinker_sessions import open_tinker_sessions

from bridges.adapters.tinker.server import TinkerServerConfig, serve_in_thread
from bridges.adapters.tinker.session import open_service


@pytest.fixture(scope="module")
def server(tiny_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    root = tmp_path_factory.mktemp("tinker-root")
    thread = serve_in_thread(
        TinkerServerConfig(model=str(tiny_path), model_name="tiny", port=0, root=str(root))
    )
    saved = {k: os.environ.get(k) for k in ("TINKER_BASE_URL", "TINKER_API_KEY", "TINKER_TELEMETRY")}
    os.environ.update(TINKER_BASE_URL=thread.url, TINKER_API_KEY="tml-local", TINKER_TELEMETRY="0")
    try:
        yield thread, root
    finally:
        thread.close()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="module")
def service(server: Any) -> Any:
    from bridges.adapters.tinker.session import open_service

    with open_service(None) as client:  # base_url from TINKER_BASE_URL, set by the server fixture
        yield client


def peft_copy(tiny_path: Path, state: dict[str, Any]) -> Any:
    """The tiny model with the saved LoRA tensors, built independently of the server."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    targets = sorted({n.split(".lora_")[0].rsplit(".", 1)[-1] for n in state["weights"]})
    model = get_peft_model(
        base, LoraConfig(r=state["rank"], lora_alpha=state["rank"], target_modules=targets)
    )
    named = dict(model.named_parameters())
    with torch.no_grad():
        for name, tensor in state["weights"].items():
            named[name].copy_(tensor)
    return model.eval()


def direct_logprobs(model: Any, tokens: list[int], targets: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([tokens])).logits[0].float()
    return torch.log_softmax(logits, -1)[torch.arange(len(targets)), torch.tensor(targets)]


def datum(tokens: list[int], **inputs: Any) -> Any:
    from tinker import types

    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": np.asarray(tokens[1:], dtype=np.int64), **inputs},
    )


def saved_state(root: Path, path: str) -> dict[str, Any]:
    """A save read straight from its folder: safetensors weights and JSON metadata, no pickle anywhere."""
    from safetensors.torch import load_file

    folder = root / path.removeprefix("tinker://")
    assert not list(folder.rglob("*.pt")) and (folder / "manifest.json").exists()
    meta = json.loads((folder / "meta.json").read_text())
    return {**meta, "weights": load_file(str(folder / "weights.safetensors"))}


def test_sampling_reports_the_models_own_logprobs(service: Any, tiny_path: Path):
    from tinker import types
    from transformers import AutoModelForCausalLM

    sampler = service.create_sampling_client(base_model="tiny")
    prompt = [5, 17, 30, 42]
    response = sampler.sample(
        types.ModelInput.from_ints(prompt),
        num_samples=3,
        sampling_params=types.SamplingParams(max_tokens=6, seed=3),
    ).result()
    base = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32).eval()
    assert len(response.sequences) == 3
    for sequence in response.sequences:
        tokens = list(sequence.tokens)
        assert 1 <= len(tokens) <= 6 and sequence.stop_reason in ("stop", "length")
        # each sampled token's logprob, as the model computes it given everything before it
        full = direct_logprobs(base, prompt + tokens[:-1], prompt[1:] + tokens)[len(prompt) - 1 :]
        torch.testing.assert_close(torch.tensor(sequence.logprobs), full, atol=1e-4, rtol=0)
    again = sampler.sample(
        types.ModelInput.from_ints(prompt),
        num_samples=3,
        sampling_params=types.SamplingParams(max_tokens=6, seed=3),
    ).result()
    assert [list(s.tokens) for s in again.sequences] == [list(s.tokens) for s in response.sequences]  # seeded
    logprobs = sampler.compute_logprobs(types.ModelInput.from_ints(prompt)).result()
    assert logprobs[0] is None
    torch.testing.assert_close(
        torch.tensor(logprobs[1:]), direct_logprobs(base, prompt[:-1], prompt[1:]), atol=1e-4, rtol=0
    )


def test_the_local_server_stops_at_an_environments_stop_strings(service: Any, tiny_tokenizer: Any):
    """Stop strings, as an environment's ``sampling_args`` send them, end a sample on the local server as on
    grpo's engine (the sampled text is cut after the stop; EOS still stops too)."""
    from tinker import types

    sampler = service.create_sampling_client(base_model="tiny")
    response = sampler.sample(types.ModelInput.from_ints(tiny_tokenizer.encode("abc")), num_samples=8,
                              sampling_params=types.SamplingParams(max_tokens=40, seed=5, stop=["e", "a"])).result()
    stopped = 0
    for sequence in response.sequences:
        tokens = list(sequence.tokens)
        text, before = tiny_tokenizer.decode(tokens), tiny_tokenizer.decode(tokens[:-1])
        assert "e" not in before and "a" not in before  # nothing sampled past the first stop
        if "e" in text or "a" in text:  # the last token completed a stop string, and the row ended there
            assert sequence.stop_reason == "stop"
            stopped += 1
    assert stopped >= 4  # ~2 characters in 100 end a row: most of 8 rows of 40 tokens meet one


def test_forward_backward_losses_equal_a_direct_torch_computation(service: Any, server: Any, tiny_path: Path):
    from tinker import types

    _, root = server
    training = service.create_lora_training_client(base_model="tiny", rank=4, seed=0).result()
    tokens = [3, 9, 27, 41, 58, 60, 71, 80]
    warmup = datum(tokens, weights=np.ones(len(tokens) - 1, dtype=np.float32))
    training.forward_backward([warmup], "cross_entropy").result()
    training.optim_step(types.AdamParams(learning_rate=5e-2)).result()  # B moves off zero: LoRA now matters
    before = saved_state(root, training.save_state("before").result().path)
    model = peft_copy(tiny_path, before)
    logp = direct_logprobs(model, tokens[:-1], tokens[1:])
    sampler_lp = torch.tensor([-4.0, -4.5, -3.0, -5.0, -4.2, -4.8, -3.9])
    advantages = torch.tensor([0.0, 0.0, 1.5, -0.5, 2.0, 1.0, -1.0])
    weights = torch.tensor([0.0, 1.0, 1.0, 1.0, 0.5, 1.0, 1.0])
    ratio = torch.exp(logp - sampler_lp)
    expected = {
        "cross_entropy": (-(weights * logp).sum(), {"weights": weights.numpy()}, None),
        "importance_sampling": (-(ratio * advantages).sum(), {"logprobs": sampler_lp.numpy(), "advantages": advantages.numpy()}, None),
        "ppo": (
            -torch.minimum(ratio * advantages, torch.clamp(ratio, 0.9, 1.1) * advantages).sum(),
            {"logprobs": sampler_lp.numpy(), "advantages": advantages.numpy()},
            {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1},
        ),
    }
    for loss_fn, (loss, inputs, config) in expected.items():
        out = training.forward([datum(tokens, **inputs)], loss_fn, config).result()
        assert out.metrics["loss:sum"] == pytest.approx(float(loss), abs=1e-4), loss_fn
        torch.testing.assert_close(
            torch.tensor(out.loss_fn_outputs[0]["logprobs"].tolist()), logp, atol=1e-4, rtol=0
        )
    # a real update changes the adapter, and only the adapter
    fb = training.forward_backward(
        [datum(tokens, **expected["importance_sampling"][1])], "importance_sampling"
    )
    step = training.optim_step(types.AdamParams(learning_rate=1e-2))
    fb.result(), step.result()
    after = saved_state(root, training.save_state("after").result().path)
    old = before
    assert set(after["weights"]) == set(old["weights"]) and all("lora_" in n for n in after["weights"])
    assert any(not torch.equal(after["weights"][n], old["weights"][n]) for n in old["weights"])


def test_saved_state_and_sampler_weights_round_trip(service: Any):
    from tinker import types

    training = service.create_lora_training_client(base_model="tiny", rank=4, seed=1).result()
    tokens = [4, 8, 15, 16, 23, 42]
    one = datum(tokens, weights=np.ones(5, dtype=np.float32))
    training.forward_backward([one], "cross_entropy").result()
    training.optim_step(types.AdamParams(learning_rate=5e-2)).result()
    reference = training.forward([one], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()
    path = training.save_state("round-trip").result().path
    restored = service.create_training_client_from_state_with_optimizer(path).result()
    assert restored.model_id != training.model_id
    again = restored.forward([one], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()
    assert again == pytest.approx(reference, abs=1e-6)
    params = types.SamplingParams(max_tokens=5, seed=11)
    prompt = types.ModelInput.from_ints([7, 8, 9])
    live = training.save_weights_and_get_sampling_client().result().sample(prompt, 2, params).result()
    saved = service.create_sampling_client(model_path=training.save_weights_for_sampler("w").result().path)
    from_path = saved.sample(prompt, 2, params).result()
    assert [list(s.tokens) for s in from_path.sequences] == [list(s.tokens) for s in live.sequences]


def test_a_bad_request_fails_at_once_instead_of_being_retried(service: Any):
    import tinker

    training = service.create_lora_training_client(base_model="tiny", rank=2).result()
    started = time.perf_counter()
    with pytest.raises(tinker.RequestFailedError, match="loss_fn 'dro' is not supported"):
        training.forward([datum([1, 2, 3], weights=np.ones(2, dtype=np.float32))], "dro").result()
    assert time.perf_counter() - started < 10  # a 500 would have been retried for minutes
    with pytest.raises(Exception, match="serves 'tiny', not 'other-model'"):
        service.create_lora_training_client(base_model="other-model", rank=2).result()


def test_tool_env_through_the_tinker_engine_masks_tool_tokens_in_datums(
    tool_model_path: Path, tmp_path: Path
):
    import bridges_test_trl_envs as envs
    from transformers import AutoTokenizer

    from bridges.adapters.tinker.datums import sample_to_datum
    from bridges.adapters.tinker.engine import TinkerEngine
    from bridges.client import EngineClient
    from bridges.workflows.rollouts import run_group
    from bridges.workflows.samples import state_to_samples

    thread = serve_in_thread(
        TinkerServerConfig(model=str(tool_model_path), model_name="tool", port=0, root=str(tmp_path))
    )
    try:
        tokenizer = AutoTokenizer.from_pretrained(tool_model_path)
        with open_service(thread.url) as service:
            sampler = service.create_sampling_client(base_model="tool")
            env = envs.add_tool()
            client = EngineClient(TinkerEngine(sampler, tokenizer), model_name="tool")
            group = asyncio.run(
                run_group(env, dict(env.get_dataset()[0]), client, 2, {"temperature": 0.0}, model="tool")
            )
    finally:
        thread.close()
    bridge = "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    for state in group.states:
        assert state.trainable and state.reward == 1.0 and state.metrics["tool_calls"] == 1.0
        (sample,) = state_to_samples(state, advantage=2.0)
        d = sample_to_datum(sample)
        targets = d.loss_fn_inputs["target_tokens"].tolist()
        advantages = d.loss_fn_inputs["advantages"].tolist()
        logprobs = d.loss_fn_inputs["logprobs"].tolist()
        assert d.model_input.to_ints() + targets[-1:] == sample.token_ids  # shifted by one, nothing lost
        trained = [t for t, a in zip(targets, advantages, strict=True) if a == 2.0]
        left_out = [t for t, a in zip(targets, advantages, strict=True) if a == 0.0]
        turns = [turn.completion_ids for turn in state.turns]
        assert trained == turns[0] + turns[1]  # exactly the two sampled turns
        assert tokenizer.decode(left_out).endswith(bridge)  # the prompt and the tool result: no gradient
        sampled_lp = [lp for lp, a in zip(logprobs, advantages, strict=True) if a]
        assert sampled_lp == pytest.approx([lp for turn in state.turns for lp in turn.logprobs])
        assert all(lp == 0.0 for lp, a in zip(logprobs, advantages, strict=True) if not a)


def test_refusals_are_one_sentence(monkeypatch: pytest.MonkeyPatch):
    from bridges.adapters.tinker.backend import BACKEND
    from bridges.runs.config import parse_config
    from bridges.runs.train_config import TrainConfig
    from bridges.runtime.errors import ConfigError

    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    cases = [
        (["backend=tinker", "tinker.base_url=local", "sampling.temperature=0.7"], "untempered distribution"),
        (["backend=tinker"], "TINKER_API_KEY is not set"),
        (["backend=tinker", "tinker.base_url=local", "tinker.loss_fn=dpo"], "tinker.loss_fn must be one of"),
        (["backend=tinker", "tinker.base_url=local", "tinker.lr=1"], "unknown config key 'tinker.lr'"),
    ]
    for argv, message in cases:
        with pytest.raises(ConfigError, match=message) as info:
            config = parse_config(TrainConfig, argv)
            BACKEND.validate(config, BACKEND.parse_options(dict(config.tinker)))
        assert str(info.value).endswith(".") and "\n" not in str(info.value)


@pytest.mark.slow
def test_backend_tinker_on_the_local_server_learns_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from bridges.train import main

    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    # a reward a random model already varies on (share of lowercase letters), so 20 steps show learning
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "grpo" / "envs"))
    common = [
        "backend=tinker", "tinker.base_url=local", "env=bridges_test_dense_env", f"output_dir={tmp_path}",
        "trainer.batch_size=8", "trainer.group_size=8", "trainer.learning_rate=1e-2", "run_name=tinker",
        "trainer.num_batches_ahead=0",  # on-policy: at lr 1e-2 a batch sampled one step behind learns far less
    ]
    sessions_before = open_tinker_sessions()  # the module's own service fixture holds one open
    assert main([*common, "trainer.max_steps=20", "save_every=10", "eval_every=10", "eval_examples=4"]) == 0
    run_dir = tmp_path / "tinker"
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rewards = [r["reward/mean"] for r in rows]
    assert [r["step"] for r in rows] == list(range(1, 21))
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert first < 0.7 and last > 0.9, (first, last)  # measured: 0.50 -> 1.00
    assert all(math.isfinite(r["loss"]) for r in rows)
    evaluated = [r for r in rows if "eval/reward/mean" in r]  # the held-out rows, through the same loop
    assert [r["step"] for r in evaluated] == [10, 20] and all(r["eval/episodes/total"] == 4 * 8 for r in evaluated)
    saved = [json.loads(x) for x in (run_dir / "checkpoints.jsonl").read_text().splitlines()]
    assert [c["step"] for c in saved] == [10, 20] and saved[-1]["data_position"] == 160
    # a new local server reads the saved files: resume continues from step 20
    assert main([*common, "trainer.max_steps=22", "resume=true"]) == 0
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 23))
    assert open_tinker_sessions() == sessions_before  # each run finished its session: no heartbeat outlives it


def test_the_server_requires_its_api_key_when_one_is_set_and_refuses_an_open_bind(
    tiny_path: Path, tmp_path: Path
):
    import httpx
    import tinker

    from bridges.runtime.errors import ConfigError

    with pytest.raises(
        ConfigError, match="refusing to serve on non-loopback host '0.0.0.0' without an api_key"
    ):
        serve_in_thread(TinkerServerConfig(model=str(tiny_path), host="0.0.0.0", port=0, root=str(tmp_path)))
    thread = serve_in_thread(
        TinkerServerConfig(
            model=str(tiny_path), model_name="tiny", port=0, root=str(tmp_path), api_key="tml-secret"
        )
    )
    try:
        denied = httpx.post(f"{thread.url}/api/v1/create_session", json={}, timeout=10)
        assert denied.status_code == 401 and "X-API-Key" in denied.json()["detail"]
        allowed = httpx.post(
            f"{thread.url}/api/v1/create_session", json={}, headers={"X-API-Key": "tml-secret"}, timeout=10
        )
        assert allowed.status_code == 200 and allowed.json()["session_id"]
        with open_service(thread.url, api_key="tml-secret") as service:
            sampler = service.create_sampling_client(base_model="tiny")
            assert sampler.compute_logprobs(tinker.types.ModelInput.from_ints([1, 2, 3])).result()[0] is None
    finally:
        thread.close()
