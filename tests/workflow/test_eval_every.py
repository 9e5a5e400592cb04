"""``eval_every``/``eval_examples``: rollouts of the held-out split during training, as ``eval/*`` keys on
the step's row, on every backend that trains here (the shared loop of grpo and Tinker, TRL's own
evaluation, verl's validation)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trace_files import run_traces

ROWS = ["trainer.batch_size=2", "trainer.group_size=4", "sampling.max_tokens=6", "progress=false"]


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_the_bundled_trainer_evaluates_the_same_rows_with_the_same_seed_every_eval_every_steps(tmp_path: Path):
    from bridges.train import main

    # a learning rate far below fp32's resolution of the weights: every evaluation sees the same weights
    args = [*ROWS, f"output_dir={tmp_path}", "run_name=r", "trainer.max_steps=3", "eval_every=2", "eval_examples=3",
            "trainer.learning_rate=1e-20"]
    assert main(args) == 0
    rows = lines(tmp_path / "r" / "metrics.jsonl")
    evaluated = [r["step"] for r in rows if "eval/reward/mean" in r]
    assert evaluated == [2, 3]  # every 2 steps, and after the last
    assert all(r["eval/episodes/total"] == 3 * 4 for r in rows if r["step"] in evaluated)
    traces = run_traces(tmp_path / "r")
    held_out = [t for t in traces if t["provenance"]["split"] == "eval"]
    assert sorted({t["provenance"]["step"] for t in held_out}) == [2, 3] and len(held_out) == 2 * 3 * 4
    assert all(t["provenance"]["split"] == "train" for t in traces if t not in held_out)

    def completions(step: int) -> list[tuple[str, list[int]]]:
        return sorted((t["answer"], t["turns"][0]["completion_ids"]) for t in held_out if t["provenance"]["step"] == step)

    from bridges.environments.repeat_letter import load_environment

    eval_answers = sorted(str(r["answer"]) for r in load_environment().get_eval_dataset().select(range(3)))
    assert sorted({a for a, _ in completions(2)}) == sorted(set(eval_answers))  # the first 3 held-out rows
    assert completions(2) == completions(3)  # same rows, same seed, same weights: the same rollouts
    assert rows[1]["eval/reward/mean"] == rows[2]["eval/reward/mean"]


def test_trl_evaluates_on_its_own_eval_steps_and_the_row_carries_it(tmp_path: Path):
    from bridges.train import main

    args = ["backend=trl", *ROWS, f"output_dir={tmp_path}", "run_name=t", "trainer.max_steps=3", "eval_every=2",
            "eval_examples=4", "env=bridges_test_dense_env"]  # TRL's rollouts vary run to run: a reward that spreads
    assert main(args) == 0
    rows = lines(tmp_path / "t" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]  # one row per step: TRL's evaluation line joins its step's
    assert [r["step"] for r in rows if "eval/reward/mean" in r] == [2, 3]
    assert all(0.0 <= r["eval/reward/mean"] <= 1.0 and r["eval/tokens/completion_mean"] > 0 for r in rows[1:])


def test_trls_evaluation_line_is_merged_into_the_row_of_its_step():
    from bridges.adapters.trl.backend import grpo_metric_row

    row_of = grpo_metric_row(8, eval_every=2, max_steps=3)
    written = [row_of(1, {"reward": 0.1, "loss": 0.0}), row_of(2, {"reward": 0.2, "loss": 0.0}),
               row_of(2, {"eval_reward": 0.5, "eval_reward_std": 0.1, "eval_loss": 0.0}),
               row_of(3, {"reward": 0.3, "loss": 0.0}), row_of(3, {"eval_reward": 0.7})]
    assert [r["step"] if r else None for r in written] == [1, None, 2, None, 3]
    assert written[2] == {"step": 2, "episodes/total": 8, "reward/mean": 0.2, "loss": 0.0,
                          "eval/reward/mean": 0.5, "eval/reward/std": 0.1}
    assert written[4]["eval/reward/mean"] == 0.7 and written[4]["reward/mean"] == 0.3


def test_verls_validation_rollouts_land_on_the_row_of_the_weights_they_sampled(tmp_path: Path):
    from bridges.adapters.verl.run_files import NATIVE_METRICS, fold_metrics

    def trace(step: int, split: str, reward: float) -> str:
        turn = {"completion_ids": [1, 2], "prompt_ids": [3]}
        return json.dumps({"reward": reward, "stop_reason": "completed", "turns": [turn],
                           "provenance": {"step": step, "split": split}}) + "\n"

    # validation before training (weights of step 0: no row), training at steps 1 and 2, validation
    # after step 2 (its traces carry step 3: one past the weights they sampled)
    (tmp_path / "traces.jsonl").write_text(
        trace(1, "eval", 0.0) + trace(1, "train", 0.25) + trace(2, "train", 0.5) + trace(3, "eval", 1.0) + trace(3, "eval", 0.0)
    )
    (tmp_path / NATIVE_METRICS).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / NATIVE_METRICS).write_text("".join(json.dumps({"step": s, "data": {"actor/pg_loss": 0.1}}) + "\n" for s in (1, 2)))
    rows = fold_metrics(tmp_path, 0)
    assert [r["step"] for r in rows] == [1, 2]
    assert "eval/reward/mean" not in rows[0] and rows[0]["reward/mean"] == 0.25
    assert rows[1]["eval/reward/mean"] == 0.5 and rows[1]["eval/episodes/total"] == 2 and rows[1]["reward/mean"] == 0.5
