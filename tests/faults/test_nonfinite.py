"""A NaN, inf or non-number reward masks its rollout; a non-finite step is never applied."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from trace_files import run_traces

import bridges as br
from bridges.envs.types import State


def make_state(text: str = "x") -> State:
    return State(
        prompt=[{"role": "user", "content": "q"}], completion=[{"role": "assistant", "content": text}]
    )


@pytest.mark.parametrize(
    "bad", [math.nan, math.inf, -math.inf, "0.5", None, [1.0], object(), np.float64("nan")]
)
async def test_a_reward_that_is_not_a_finite_number_marks_the_rollout(bad: Any):
    rubric = br.Rubric([lambda completion: 1.0, lambda completion: bad])
    state = make_state()
    await rubric.score_rollout(state)
    assert state.reward is None and state.stop_reason == "reward_error"
    assert "which is not a finite number" in state.error


@pytest.mark.parametrize(
    ("good", "expected"), [(True, 1.0), (np.float32(0.25), 0.25), (torch.tensor(0.5), 0.5), (3, 3.0)]
)
async def test_real_numbers_of_any_kind_are_rewards(good: Any, expected: float):
    rubric = br.Rubric([lambda completion: good])
    state = make_state()
    await rubric.score_rollout(state)
    assert state.error is None and state.reward == pytest.approx(expected)


async def test_a_group_function_with_one_nan_masks_only_that_member():
    def group_reward(completions) -> list[float]:
        return [1.0, math.nan, 0.0]

    rubric = br.Rubric([group_reward])
    states = [make_state(), make_state(), make_state()]
    await rubric.score_group(states)
    assert [s.reward for s in states] == [1.0, None, 0.0]
    assert states[1].stop_reason == "reward_error"


async def test_an_overridden_score_group_that_writes_nan_is_masked_before_training():
    from datasets import Dataset

    class Overrides(br.SingleTurnEnv):
        async def score_group(self, states: list[State]) -> None:
            for state in states:
                state.reward = math.inf

    env = Overrides(dataset=Dataset.from_list([{"question": "q", "answer": "a"}]))
    states = [make_state(), make_state()]
    await env.score(states)
    assert all(s.reward is None and s.stop_reason == "reward_error" for s in states)
    assert "inf" in states[0].error


def _context(tiny_path: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM

    from bridges.grpo.loss import LossConfig
    from bridges.grpo.precision import MasterWeights, make_optimizer, make_scaler
    from bridges.grpo.trainer import StepContext

    policy = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    master = MasterWeights(policy)
    optimizer = make_optimizer(master.params, 1e-2, 0.0)
    ctx = StepContext(
        policy=policy, reference=None, optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0), loss_config=LossConfig(),
        pad_token_id=0, temperature=1.0, grad_accum_steps=1, max_grad_norm=1.0, master=master,
        scaler=make_scaler(torch.float32, torch.device("cpu")), device=torch.device("cpu"),
    )
    return ctx, policy


def test_a_step_with_a_non_finite_loss_is_skipped_and_the_weights_stay_as_they_were(tiny_path: Path):
    from bridges.grpo.trainer import train_step
    from bridges.workflows.types import TrainingSample

    ctx, policy = _context(tiny_path)
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    sample = TrainingSample(
        token_ids=[1, 2, 3, 4, 5], loss_mask=[0, 0, 1, 1, 1], logprobs=[0.0, 0.0, -1.0, -1.0, -1.0],
        advantage=math.nan,
    )
    result = train_step(ctx, [sample])
    assert result["skipped_nonfinite"] == 1.0 and not math.isfinite(result["loss"])
    after = policy.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    sample.advantage = 1.0
    result = train_step(ctx, [sample])
    assert result["skipped_nonfinite"] == 0.0 and math.isfinite(result["grad_norm"])
    assert any(not torch.equal(before[k], policy.state_dict()[k]) for k in before)


def test_the_run_stops_in_one_sentence_after_three_non_finite_steps_in_a_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    import bridges.grpo.trainer as trainer
    from bridges.train import main

    def diverging(ctx: Any, samples: list[Any]) -> dict[str, float]:  # what train_step reports for NaN
        return {"loss": math.nan, "grad_norm": math.nan, "clip_fraction": 0.0, "ratio/mean": 1.0, "kl": 0.0,
                "skipped_nonfinite": 1.0}

    monkeypatch.setattr(trainer, "train_step", diverging)
    argv = [f"output_dir={tmp_path}", "run_name=nan", "trainer.max_steps=10", "trainer.batch_size=4",
            "trainer.group_size=4", "progress=false", "sampling.max_tokens=4"]
    with pytest.raises(SystemExit) as exit_info:
        from bridges.runs.config import run_cli

        run_cli(main, argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    (line,) = [x for x in err.splitlines() if x.startswith("error:")]
    assert "Traceback" not in err and "steps in a row had a non-finite loss or gradient norm" in line
    rows = [json.loads(x) for x in (tmp_path / "nan" / "metrics.jsonl").read_text().splitlines()]
    assert [r["skipped_nonfinite"] for r in rows] == [1.0, 1.0]  # the third stopped the run before logging
    assert len(run_traces(tmp_path / "nan")) == 3 * 16  # finished work is kept
