"""Command-line configuration: typed overrides, open pass-through sections, one-sentence errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bridges.runs.config import parse_config
from bridges.runs.train_config import TrainConfig
from bridges.runtime.errors import ConfigError


def test_overrides_nested_keys_and_open_sections(tmp_path):
    yaml_file = tmp_path / "run.yaml"
    yaml_file.write_text("trainer:\n  max_steps: 7\nenv_args:\n  alphabet: xy\n")
    config = parse_config(
        TrainConfig,
        [
            f"config={yaml_file}",
            "trainer.learning_rate=1e-4",
            "trl.num_iterations=2",
            "verl.trainer.n_gpus_per_node=8",
        ],
    )
    assert config.trainer.max_steps == 7 and config.trainer.learning_rate == pytest.approx(1e-4)
    assert config.env_args == {"alphabet": "xy"}
    assert config.trl == {"num_iterations": 2} and config.verl == {"trainer": {"n_gpus_per_node": 8}}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["trainer.max_stepz=3"],
            "unknown config key 'trainer.max_stepz' (did you mean 'trainer.max_steps'?)",
        ),
        (["bakend=trl"], "unknown config key 'bakend' (did you mean 'backend'?)"),
        (["trainer.max_steps=three"], "invalid value for config key 'trainer.max_steps'"),
        (["trainer.max_steps.x=1"], "has no sub-key 'x'"),
        (["max_steps"], "is not of the form key=value"),
        (["config=/nonexistent.yaml"], "does not exist"),
    ],
)
def test_bad_input_is_one_clear_sentence(args, message):
    with pytest.raises(ConfigError) as info:
        parse_config(TrainConfig, args)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_cli_prints_the_sentence_and_exits_2():
    result = subprocess.run(
        [sys.executable, "-m", "bridges.train", "trainer.max_stepz=3"], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert result.stderr.strip().startswith("error: unknown config key 'trainer.max_stepz'")
    assert "Traceback" not in result.stderr


def test_unknown_backend_lists_the_available_ones():
    result = subprocess.run(
        [sys.executable, "-m", "bridges.train", "backend=nope"], capture_output=True, text=True
    )
    assert result.returncode == 2 and "unknown backend 'nope'; available backends: grpo" in result.stderr


def test_an_unset_learning_rate_suits_the_model_and_help_says_which(tmp_path):
    from bridges.jobs.train import train_schema
    from bridges.runs.config import HelpRequested

    def resolved(*args: str) -> float:
        return parse_config(TrainConfig, list(args)).resolved_learning_rate

    assert resolved() == 1.5e-3 and resolved("model=tiny-qwen3") == 1.5e-3  # the built-in tiny models
    assert resolved(f"model={tmp_path}") == 1e-6  # any other checkpoint: full fine-tuning
    assert resolved(f"model={tmp_path}", "trainer.lora_rank=8") == 1e-5  # ...or a LoRA adapter
    assert resolved(f"model={tmp_path}", "trainer.learning_rate=3e-4") == 3e-4  # said is said
    with pytest.raises(HelpRequested) as shown:
        parse_config(train_schema(), ["--help"])
    assert "None: 0.0015 for the built-in tiny models, 1e-06 for full fine-tuning and 1e-05 for LoRA" in str(shown.value)
