"""TRL's log lines reach metrics.jsonl through one callback, for GRPO and SFT runs alike."""

from __future__ import annotations

from pathlib import Path

from transformers import TrainerControl, TrainerState, TrainingArguments

from bridges.adapters.trl.backend import grpo_metric_row
from bridges.adapters.trl.metrics_file import metrics_callback
from bridges.adapters.trl.sft import sft_metric_row

TRL = Path(__file__).resolve().parents[2] / "adapters" / "trl"


class Rows:
    def __init__(self) -> None:
        self.rows: list[dict] = []

    def log(self, row: dict) -> None:
        self.rows.append(row)

    report = log  # the StepProgress side of the callback


def log_lines(callback, lines: list[dict]) -> None:
    state, control = TrainerState(), TrainerControl()
    for step, logs in enumerate(lines, start=1):
        state.global_step = step
        callback.on_log(TrainingArguments(output_dir="out", report_to=[]), state, control, logs=logs)


def test_grpo_rows_skip_lines_without_a_reward_and_count_the_step_episodes():
    logger, progress = Rows(), Rows()
    log_lines(metrics_callback(grpo_metric_row(32), logger, progress),
              [{"reward": 0.5, "loss": 0.1}, {"eval_loss": 1.0}, {}, {"reward": 0.75}])
    assert [r["step"] for r in logger.rows] == [1, 4] and logger.rows == progress.rows
    assert logger.rows[0]["episodes/total"] == 32 and logger.rows[1]["reward/mean"] == 0.75


def test_sft_rows_and_a_rank_without_a_logger():
    logger = Rows()
    log_lines(metrics_callback(sft_metric_row, logger), [{"loss": 2.0, "learning_rate": 1e-4}, {"train_runtime": 3.0}])
    assert logger.rows == [{"step": 1, "loss": 2.0, "lr": 1e-4, "grad_norm": None, "tokens/seen": None}]
    log_lines(metrics_callback(sft_metric_row, None), [{"loss": 1.0}])  # ranks other than 0 write nothing


def test_one_metrics_callback_class_in_the_trl_adapter():
    defined = [p.name for p in TRL.glob("*.py") if "class MetricsFile" in p.read_text()]
    assert defined == ["metrics_file.py"]
