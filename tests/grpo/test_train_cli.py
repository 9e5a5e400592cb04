"""``python -m bridges.train`` as a user runs it: dry run, checkpoint then resume, wandb offline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from trace_files import run_traces

from bridges.grpo.trainer import run
from bridges.runs.config import parse_config
from bridges.runs.train_config import TrainConfig

REPO = Path(__file__).resolve().parents[2]
SMALL = ["trainer.batch_size=4", "trainer.group_size=4", "progress=false"]


def train(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bridges.train", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def test_dry_run_prints_the_resolved_config_and_writes_nothing(tmp_path: Path):
    result = train(
        "dry_run=true", "trainer.max_steps=7", f"config={REPO / 'examples/grpo_tiny.yaml'}", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert "max_steps: 7" in result.stdout  # the command line wins over the file
    assert "save_every: 0" in result.stdout and "alphabet: abcdefgh" in result.stdout
    assert not (tmp_path / "runs").exists()


def test_the_example_config_is_the_embedded_default_written_out():
    import inspect

    from bridges.environments import repeat_letter
    from bridges.runs.config import parse_config
    from bridges.runs.train_config import TrainConfig, learning_rate

    from_file = parse_config(TrainConfig, [f"config={REPO / 'examples/grpo_tiny.yaml'}"])
    default = parse_config(TrainConfig, [])
    assert learning_rate(from_file.trainer, "tiny", lora=False) == learning_rate(default.trainer, "tiny", lora=False)
    own = inspect.signature(repeat_letter.load_environment).parameters
    assert all(own[key].default == value for key, value in from_file.env_args.items())  # the env's own defaults
    from_file.trainer.learning_rate, from_file.env_args = default.trainer.learning_rate, default.env_args
    assert from_file == default


def test_checkpoint_every_step_then_resume_continues_from_step_two(tmp_path: Path):
    first = train("trainer.max_steps=2", "save_every=1", *SMALL, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    run_dir = tmp_path / "runs" / "grpo-repeat_letter"
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_000001", "step_000002"]
    second = train("resume=true", "trainer.max_steps=3", *SMALL, cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert "(step 2, data position 8)" in second.stdout
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert (run_dir / "checkpoints" / "step_000003").is_dir() and (run_dir / "reward_curve.png").exists()
    # a checkpoint is a usable model folder: weights and tokenizer load with from_pretrained
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = run_dir / "checkpoints" / "step_000003" / "model"
    assert AutoTokenizer.from_pretrained(model_dir).chat_template and AutoModelForCausalLM.from_pretrained(
        model_dir
    )
    steps = [
        line["provenance"]["step"] for line in run_traces(run_dir)
    ]
    assert steps == [1] * 16 + [2] * 16 + [3] * 16  # the resumed run generated only step 3


def test_a_bad_key_is_one_sentence_and_exit_2(tmp_path: Path):
    result = train("trainer.max_step=3", cwd=tmp_path)
    assert result.returncode == 2
    err = result.stderr.strip()
    assert err.startswith("error: unknown config key 'trainer.max_step' (did you mean 'trainer.max_steps'?)")
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "runs").exists()


def test_report_to_wandb_logs_offline_without_a_network(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    config = parse_config(
        TrainConfig, [f"output_dir={tmp_path}", "report_to=wandb", "trainer.max_steps=2", *SMALL]
    )
    assert run(config) == 0
    offline = list((tmp_path / "grpo-repeat_letter" / "wandb").glob("offline-run-*"))
    assert len(offline) == 1
    assert list(offline[0].glob("run-*.wandb"))  # the run's history, ready for `wandb sync`
