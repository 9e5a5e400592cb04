"""The configs in examples/accelerate/ mean to the bundled trainer what they mean to accelerate: the
environment ``accelerate launch --config_file <file>`` gives its workers (built by accelerate's own
launch code here, as on a GPU machine) selects the strategy and precision, and DeepSpeed is refused
in one sentence (TRL runs it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridges.runs.config import parse_config
from bridges.runs.train_config import TrainConfig
from bridges.runtime.errors import ConfigError

CONFIGS = Path(__file__).resolve().parents[2] / "examples" / "accelerate"


def launch_environment(name: str) -> dict[str, str]:
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

    args = launch_command_parser().parse_args(["--config_file", str(CONFIGS / name), "-m", "bridges.train"])
    args, _, _ = _validate_launch_command(args)
    if args.use_deepspeed:
        args.deepspeed_fields_from_accelerate_config = ""
        return dict(prepare_deepspeed_cmd_env(args)[1])
    return dict(prepare_multi_gpu_env(args))


@pytest.mark.parametrize(("name", "expected"), [("ddp.yaml", ("bf16", "ddp")), ("fsdp.yaml", ("bf16", "fsdp"))])
def test_ddp_and_fsdp_configs_set_the_trainers_strategy_and_precision(name, expected, monkeypatch):
    from bridges.grpo.trainer import hardware_settings

    for key, value in launch_environment(name).items():
        monkeypatch.setenv(key, value)
    assert hardware_settings(parse_config(TrainConfig, [])) == expected
    explicit = parse_config(TrainConfig, ["trainer.dtype=fp32"])  # a setting on the command line wins
    assert hardware_settings(explicit)[0] == "fp32"


@pytest.mark.parametrize("name", ["zero2.yaml", "zero3.yaml"])
def test_deepspeed_configs_are_refused_by_the_bundled_trainer_and_kept_for_trl(name, monkeypatch):
    from bridges.grpo.trainer import validate

    environment = launch_environment(name)
    assert environment["ACCELERATE_USE_DEEPSPEED"] == "true" and environment["ACCELERATE_DEEPSPEED_ZERO_STAGE"] == name[4]
    for key, value in environment.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ConfigError, match=r"backend=grpo does not run DeepSpeed; .*examples/accelerate/fsdp.yaml"):
        validate(parse_config(TrainConfig, []))
