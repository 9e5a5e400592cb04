"""The GRPO trainer end to end on CPU: it learns, resumes exactly, and survives failing rollouts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from trace_files import run_traces

from bridges.grpo.trainer import run
from bridges.runs.config import parse_config
from bridges.runs.train_config import TrainConfig


@pytest.fixture(autouse=True)
def _test_envs_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "envs"))


def _config(tmp_path: Path, *args: str) -> TrainConfig:
    return parse_config(TrainConfig, [f"output_dir={tmp_path}", "progress=false", *args])


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "checkpoints" / f"step_{step:06d}" / "model" / "model.safetensors"))


@pytest.mark.slow
def test_embedded_default_learns_in_a_short_run(tmp_path):
    assert run(_config(tmp_path, "trainer.max_steps=160")) == 0
    run_dir = tmp_path / "grpo-repeat_letter"
    rewards = [row["reward/mean"] for row in _metrics(run_dir)]
    assert len(rewards) == 160
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    assert first < 0.1  # a random model almost never repeats the letter
    assert last > 0.3, (first, last)  # the full 300-step default reaches > 0.9
    assert (run_dir / "reward_curve.png").stat().st_size > 1000
    traces = run_traces(run_dir)
    assert len(traces) == 160 * 16 * 16  # every episode traced, with provenance
    assert (run_dir / "traces.jsonl.gz").stat().st_size < 10 * 1024 * 1024  # compressed: the default run's fits
    provenance = traces[0]["provenance"]
    assert (
        provenance["backend"] == "grpo"
        and provenance["env_id"] == "repeat_letter"
        and provenance["step"] == 1
    )


def test_resume_gives_the_same_parameters_as_a_straight_run(tmp_path):
    small = ["env=bridges_test_dense_env", "trainer.batch_size=4", "trainer.group_size=4", "save_every=1"]
    small += ["trainer.num_batches_ahead=0", "keep_checkpoints=3"]
    straight = tmp_path / "straight"
    assert run(_config(straight, *small, "trainer.max_steps=3")) == 0
    resumed = tmp_path / "resumed"
    assert run(_config(resumed, *small, "trainer.max_steps=2")) == 0
    assert run(_config(resumed, *small, "trainer.max_steps=3", "resume=true")) == 0
    name = "grpo-bridges_test_dense_env"
    a = _weights(straight / name, 3)
    b = _weights(resumed / name, 3)
    first = _weights(resumed / name, 2)
    assert any(not torch.equal(first[k], b[k]) for k in b)  # step 3 really trained
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=1e-5, rtol=1e-5)
    steps = [row["step"] for row in _metrics(resumed / name)]
    assert steps == [1, 2, 3]  # the resumed run's metrics read like one straight run


def test_failing_rollouts_are_masked_and_never_abort_a_step_and_the_run_ends_quoting_the_reward(tmp_path):
    from bridges.runtime.errors import RewardFunctionError

    args = [
        "env=bridges_test_flaky_env",
        "trainer.max_steps=3",
        "trainer.batch_size=4",
        "trainer.group_size=6",
    ]
    with pytest.raises(RewardFunctionError) as info:  # every step trained; then the bug, in one sentence
        run(_config(tmp_path, *args))
    said = str(info.value)
    assert said.startswith("reward function 'flaky' raised RuntimeError: judge unavailable (example ")
    assert "24 of 72 rollouts masked" in said and said.endswith("(resume=true continues).")
    rows = _metrics(tmp_path / "grpo-bridges_test_flaky_env")
    assert [r["step"] for r in rows] == [1, 2, 3]
    for row in rows:
        assert row["episodes/total"] == 24
        assert row["episodes/masked"] == row["stop/reward_error"] >= 1
    # every third reward call raised: a third of all 72 rollouts. Per step the count varies, because the
    # next batch is already being scored (num_batches_ahead=1) while one step trains
    assert sum(row["stop/reward_error"] for row in rows) == 24
    traces = run_traces(tmp_path / "grpo-bridges_test_flaky_env")
    failed = [t for t in traces if t["stop_reason"] == "reward_error"]
    assert len(failed) == 24 and all("judge unavailable" in t["error"] for t in failed)
    assert all(t["advantage"] == 0.0 and t["reward"] is None for t in failed)


def test_lora_trains_only_the_adapter_and_the_engine_samples_with_it(tmp_path, monkeypatch):
    import bridges.grpo.trainer as trainer_module

    engines = []
    make_engine = trainer_module.make_engine
    monkeypatch.setattr(
        trainer_module, "make_engine", lambda *a: engines.append(make_engine(*a)) or engines[-1]
    )
    args = [
        "env=bridges_test_dense_env",
        "trainer.batch_size=4",
        "trainer.group_size=4",
        "trainer.lora_rank=4",
    ]
    assert run(_config(tmp_path, *args, "trainer.max_steps=2", "trainer.learning_rate=1e-2")) == 0
    saved = tmp_path / "grpo-bridges_test_dense_env" / "checkpoints" / "step_000002" / "model"
    adapter = load_file(str(saved / "adapter_model.safetensors"))
    assert adapter and all("lora_" in name for name in adapter)  # only the adapter is checkpointed
    assert any(
        float(t.abs().sum()) > 0 for n, t in adapter.items() if "lora_B" in n
    )  # B starts at 0: it trained
    engine = engines[0]
    assert engine.weight_version == 3  # the policy as the run starts, then one sync per optimizer step
    # the engine holds plain weights (no peft wrapper): each adapted layer is base + (alpha / r) * B @ A
    from transformers import AutoModelForCausalLM

    from bridges.models.tiny import resolve_model_path
    from bridges.models.weight_payload import base_name

    assert not any("lora_" in name for name, _ in engine.model.named_parameters())
    base = AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny")).state_dict()
    served = engine.model.state_dict()
    layers = {base_name(n.rsplit(".lora_", 1)[0]) for n in adapter}
    assert layers and all(layer.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) for layer in layers)
    for layer in layers:  # the engine samples with exactly the trained adapter, merged
        a = adapter[f"base_model.model.{layer}.lora_A.weight"]
        b = adapter[f"base_model.model.{layer}.lora_B.weight"]
        torch.testing.assert_close(served[f"{layer}.weight"], base[f"{layer}.weight"] + 32 / 4 * (b @ a))


def test_rollouts_in_a_child_process_train_with_the_synced_weights(tmp_path):
    args = ["env=bridges_test_dense_env", "trainer.batch_size=4", "trainer.group_size=4"]
    assert run(_config(tmp_path, *args, "trainer.max_steps=4", "trainer.rollout_process=true")) == 0
    run_dir = tmp_path / "grpo-bridges_test_dense_env"
    rows = _metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and rows[-1]["weight_version"] == 5  # start + 4 steps
    assert all(r["episodes/total"] == 16 and r["episodes/masked"] == 0 for r in rows)
    traces = run_traces(run_dir)
    assert traces[0]["provenance"]["engine"] == "hf (rollout process)"
    versions = {t["provenance"]["step"]: t["provenance"]["weight_version"] for t in traces}
    # the child samples step 1 and 2 with the starting policy (one batch ahead), then with synced weights
    assert versions[1] == versions[2] == 1 and versions[3] >= 2 and versions[4] >= versions[3]
