"""The same faults through each CPU-runnable backend: the step completes, the faulty rollouts are
masked and counted with their reason, the healthy ones train."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from faulty_engine import FaultyEngine
from trace_files import run_traces

from bridges.runtime.errors import RewardFunctionError

MIXED = "env_args.cases=[ok,env_raises,reward_raises,reward_nan]"  # one healthy row, three faulty rows


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_grpo_step_completes_with_env_reward_and_engine_faults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    import bridges.grpo.trainer as trainer
    from bridges.runs.config import parse_config
    from bridges.runs.train_config import TrainConfig

    make_engine = trainer.make_engine
    faults = {"[engine:permanent]": "permanent", "[engine:nan]": "nan"}
    monkeypatch.setattr(trainer, "make_engine", lambda *a: FaultyEngine(make_engine(*a), plan_prompts=faults))
    config = parse_config(
        TrainConfig,
        [
            "env=bridges_fault_env",
            "env_args.cases=[ok,env_raises,reward_raises,engine:permanent,engine:nan,reward_nan,reward_str]",
            f"output_dir={tmp_path}", "progress=false", "trainer.max_steps=2", "trainer.batch_size=7",
            "trainer.group_size=2", "run_name=faults",
        ],
    )
    with pytest.raises(RewardFunctionError, match=r"^reward function .* raised .*12 of 28 rollouts masked"):
        trainer.run(config)  # both steps trained on what was sound; the run then ends on the failed rewards
    for row in metrics(tmp_path / "faults"):
        assert row["episodes/total"] == 14 and row["episodes/masked"] == 12
        assert (row["stop/env_error"], row["stop/reward_error"], row["stop/engine_error"]) == (2, 6, 4)
        assert row["stop/max_turns"] == 2 and torch.isfinite(torch.tensor(row["loss"]))
        assert row["skipped_nonfinite"] == 0.0 and math.isfinite(row["reward/mean"])
    traces = run_traces(tmp_path / "faults")
    nan_errors = [
        t["error"] for t in traces if "[reward_nan]" in str(t["prompt"]) or "[reward_str]" in str(t["prompt"])
    ]
    assert len(nan_errors) == 8 and all("which is not a finite number" in e for e in nan_errors)
    from safetensors.torch import load_file

    (weights,) = (tmp_path / "faults" / "checkpoints").glob("step_*/model/*.safetensors")
    assert all(bool(torch.isfinite(t).all()) for t in load_file(str(weights)).values())


def test_trl_step_completes_and_keeps_failed_rollouts_out(tiny_path: Path, tmp_path: Path):
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from bridges.adapters.trl import trl_trainer_kwargs
    from bridges.envs.registry import load_environment

    env = load_environment("bridges_fault_env", cases=["ok", "env_raises", "reward_raises", "reward_nan"])
    args = GRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=2, max_completion_length=64,
        max_steps=1, use_cpu=True, bf16=False, report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_path),
        args=args,
        processing_class=AutoTokenizer.from_pretrained(tiny_path),
        **trl_trainer_kwargs(env, num_generations=2),
    )
    trainer.train()
    (log,) = [h for h in trainer.state.log_history if "reward" in h]
    assert log["env/errored_fraction"] == pytest.approx(6 / 8)  # three faulty rows x two rollouts
    assert torch.isfinite(torch.tensor(log["loss"])) and trainer.state.global_step == 1


def test_tinker_step_completes_with_faulty_rollouts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from bridges.train import main

    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    argv = [
        "backend=tinker", "tinker.base_url=local", "env=bridges_fault_env", MIXED, f"output_dir={tmp_path}",
        "trainer.max_steps=2", "trainer.batch_size=4", "trainer.group_size=2", "run_name=faults",
    ]
    with pytest.raises(RewardFunctionError, match="8 of 16 rollouts masked"):
        main(argv)
    for row in metrics(tmp_path / "faults"):
        assert row["episodes/total"] == 8 and row["episodes/masked"] == 6
        assert (row["stop/env_error"], row["stop/reward_error"]) == (2, 4)
        assert math.isfinite(row["loss"]) and row.get("skipped_nonfinite", 0.0) == 0.0


def test_verl_worker_returns_masked_samples_for_faulty_rollouts(
    tmp_path: Path, tiny_path: Path, tiny_tokenizer: Any
):
    from verl_harness import batch_of, compose, rows_of, run_worker

    from bridges.adapters.verl.hf_rollout import HFRolloutServer

    cfg, files = compose(tmp_path, tiny_path, "", MIXED, "sampling.max_tokens=64", env="bridges_fault_env")
    rows = rows_of(
        run_worker(cfg, batch_of(cfg, files, tiny_tokenizer, rows=4), HFRolloutServer(str(tiny_path))), cfg
    )
    assert len(rows) == 8
    reasons = sorted(row["stop"] for row in rows)
    assert reasons == ["env_error"] * 2 + ["max_turns"] * 2 + ["reward_error"] * 4
    for row in rows:
        if row["stop"] == "max_turns":
            assert row["valid"] and any(row["mask"])
        else:
            assert (
                not row["valid"]
                and row["reward"] == 0.0
                and not any(row["mask"])
                and ("injected" in row["error"] or "not a finite number" in row["error"])
            )
