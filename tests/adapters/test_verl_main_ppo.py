"""verl's real trainer, end to end on this CPU: ``python -m bridges.train backend=verl`` launches
``verl.trainer.main_ppo`` (FSDP2 actor, our ``hf`` rollout, our agent loop), two steps, then resumes
through verl's own ``resume_mode=auto`` for a third. Nothing is stood in for."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from trace_files import run_traces

from bridges.runs.metrics import SHARED_METRICS
from bridges.train import main

SMALL = ["backend=verl", "trainer.batch_size=2", "trainer.group_size=4", "sampling.max_tokens=8", "save_every=1",
         "run_name=r", "progress=false", "env=bridges_test_dense_env"]
ENVS = Path(__file__).parents[1] / "grpo" / "envs"  # bridges_test_dense_env: a reward every group spreads on


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


BUILDER_WARNING = "No model-specific Continuous Token builder is registered"


@pytest.mark.slow
def test_main_ppo_trains_two_steps_then_resumes_for_a_third(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], tiny_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("PYTHONPATH", str(ENVS))  # verl's processes and Ray's workers import the environment
    run = tmp_path / "r"
    assert main([*SMALL, "trainer.max_steps=2", f"output_dir={tmp_path}"]) == 0
    # verl's own output is in the run's console log; the console shows the step lines and the result
    out, err = capfd.readouterr()
    log = (run / "verl" / "console.log").read_text()
    assert "Training Progress" in log and log.count(BUILDER_WARNING) <= 1  # once per process, not per rollout
    assert "verl.trainer.main_ppo" in log.splitlines()[0]  # the command it ran, first
    assert err == "" and BUILDER_WARNING not in out and "actor_rollout_ref" not in out
    assert [line for line in out.splitlines() if line.startswith("step ")] == [
        line for line in out.splitlines() if re.fullmatch(r"step [12]: reward=[\d.]+ loss=-?[\d.]+", line)
    ]
    # template check, the attention choice, where verl's log is, 2 steps, reward, files
    assert len(out.splitlines()) == 7, out
    assert out.splitlines()[1] == "verl attention: sdpa without remove-padding (no GPU)"
    assert (run / "checkpoints" / "global_step_2").is_dir()
    assert (run / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    first = lines(run / "metrics.jsonl")
    assert [r["step"] for r in first] == [1, 2]

    # verl recomputes the old logprobs this time (the default on CPU reuses the rollout's), so it reports
    # how far the rollout's logprobs are from the actor's: the weights it resumed must have reached the rollout
    recompute = "verl.algorithm.rollout_correction.bypass_mode=false"
    assert main([*SMALL, "trainer.max_steps=3", "resume=true", recompute, f"output_dir={tmp_path}"]) == 0
    native = {r["step"]: r["data"] for r in lines(run / "verl" / "native_metrics.jsonl")}
    assert any(k.startswith("val-core/") for k in native[2])  # verl validates the checkpoint it resumed from
    assert "actor/pg_loss" not in native[2] and "actor/pg_loss" in native[3]  # then trains step 3 only
    assert native[3]["training/rollout_probs_diff_max"] < 0.01

    rows = lines(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[:2] == first
    for row in rows:
        missing = [name for name in SHARED_METRICS if name not in row]
        assert not missing, f"verl lacks {missing}; it logs {sorted(row)}"
        assert row["episodes/total"] == 8 and 0.0 <= row["episodes/masked_fraction"] <= 1.0 and row["lr"] > 0
        if row["episodes/masked"] == 0:  # the rubric's one function (weight 1) is the total, read from the traces
            assert row["reward/lowercase_share/mean"] == pytest.approx(row["reward/mean"])
    traces = run_traces(run)
    trained = [t for t in traces if t["provenance"]["split"] == "train"]
    assert sorted(t["provenance"]["step"] for t in trained) == [1] * 8 + [2] * 8 + [3] * 8
    assert {t["provenance"]["split"] for t in traces} == {"train", "eval"}  # validation rollouts, marked
    assert all(t["provenance"]["backend"] == "verl" and t["turns"][0]["completion_ids"] for t in traces)
    assert (run / "reward_curve.png").exists()

    # the trained actor leaves as one Hugging Face folder: verl's own merger over its FSDP shards
    import torch
    from transformers import AutoModelForCausalLM

    from bridges.export import main as export

    assert export([f"model={run}", f"output={tmp_path / 'exported'}"]) == 0
    assert "verl's sharded actor merged" in capfd.readouterr().out
    exported = dict(AutoModelForCausalLM.from_pretrained(tmp_path / "exported", dtype=torch.float32).named_parameters())
    initial = dict(AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32).named_parameters())
    assert exported.keys() == initial.keys()
    assert not all(torch.equal(exported[n], initial[n]) for n in initial)  # three steps trained it
