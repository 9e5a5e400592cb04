"""backend=trl as its users run it on GPUs, checked through the GRPOConfig the run builds (TRL's own
arithmetic and validation), with GPU facts faked only at the device seam: the step's rollouts split
over gradient accumulation, vLLM chosen by engine=, the ratio cap as TRL's delta, and the settings
that cannot work refused in one sentence."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from bridges.adapters.trl.backend import build_grpo_config, generation_settings, grpo_config_kwargs
from bridges.envs.registry import load_environment
from bridges.models.hardware import Placement
from bridges.runs.config import parse_config, run_cli
from bridges.runs.train_config import TrainConfig
from bridges.train import main

CPU = Placement(torch.device("cpu"), torch.float32, "sdpa")
GPU = Placement(torch.device("cuda:0"), torch.bfloat16, "sdpa")


def grpo_config(tmp_path: Path, *argv: str) -> Any:
    config = parse_config(TrainConfig, ["backend=trl", "trainer.device=cpu", *argv])
    return build_grpo_config(grpo_config_kwargs(config, load_environment(config.env), tmp_path))


@pytest.mark.parametrize("accum", [1, 2, 4])
def test_an_optimizer_step_generates_the_steps_rollouts_whatever_the_accumulation(accum: int, tmp_path: Path):
    """TRL generates per_device x processes x accumulation sequences per optimizer step; that is the step's
    batch_size x group_size rollouts, as in the bundled trainer (it was accumulation times more)."""
    args = grpo_config(tmp_path, "trainer.batch_size=4", "trainer.group_size=4", f"trainer.grad_accum_steps={accum}")
    assert args.gradient_accumulation_steps == accum and args.per_device_train_batch_size == 16 // accum
    assert args.generation_batch_size == 16 and args.generation_batch_size % args.num_generations == 0


def test_dr_grpo_on_trl_leaves_the_std_out_as_every_backend_does(tmp_path: Path):
    """TRL's scale_rewards decides the std division, not its loss_type: dr_grpo left at "group" still divided
    by the std (+1.5/-0.5 on a 0/1 group of four where the others give +0.75/-0.25)."""
    assert grpo_config(tmp_path, "trainer.loss=dr_grpo").scale_rewards == "none"
    assert grpo_config(tmp_path).scale_rewards == "group"
    assert grpo_config(tmp_path, "trainer.loss=dr_grpo", "trl.scale_rewards=batch").scale_rewards == "batch"  # trl.* wins


def test_the_ratio_cap_is_trls_delta(tmp_path: Path):
    """One objective everywhere: TRL truncates the ratio where the bundled trainer does (default 4)."""
    from bridges.runs.train_config import TrainerConfig

    assert grpo_config(tmp_path, "trainer.ratio_cap=3.5").delta == 3.5
    assert grpo_config(tmp_path).delta == TrainerConfig().ratio_cap == 4.0


def test_engine_chooses_trls_vllm_colocated_or_on_its_server(monkeypatch: pytest.MonkeyPatch):
    import importlib.util

    def config(*argv: str) -> TrainConfig:
        return parse_config(TrainConfig, ["backend=trl", *argv])

    real = importlib.util.find_spec
    for installed in (False, True):
        monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, found=installed:
                            (object() if found else None) if name == "vllm" else real(name, *a))
        assert generation_settings(config(), GPU) == ({"use_vllm": True, "vllm_mode": "colocate"} if installed else {})
        assert generation_settings(config(), CPU) == {}  # auto: vLLM only on a GPU
    assert generation_settings(config("engine=hf"), GPU) == {}
    assert generation_settings(config("engine=vllm"), GPU) == {"use_vllm": True, "vllm_mode": "colocate"}
    served = config("engine=vllm", "trl.vllm_server_base_url=http://127.0.0.1:8000")
    assert generation_settings(served, GPU) == {"use_vllm": True, "vllm_mode": "server"}


@pytest.mark.parametrize(
    ("argv", "environment", "piece"),
    [
        (["trainer.batch_size=3", "trainer.group_size=3", "trainer.grad_accum_steps=2"], {},
         "9 rollouts per step do not split into 1 process(es) x trainer.grad_accum_steps=2 equal micro-batches"),
        (["engine=vllm"], {}, "engine=vllm with backend=trl runs vLLM in this process: pip install 'rl-bridges[vllm]'"),
        (["env=guess_number"], {"ACCELERATE_USE_FSDP": "true"},
         "backend=trl under accelerate's FSDP cannot run guess_number's turns on the model it trains"),
    ],
)
def test_settings_that_cannot_work_on_gpus_are_one_sentence(argv: list[str], environment: dict[str, str], piece: str,
                                                            monkeypatch: pytest.MonkeyPatch, capsys):
    for key, value in environment.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SystemExit) as exited:
        run_cli(main, ["backend=trl", "dry_run=true", *argv])
    err = capsys.readouterr().err.strip()
    assert exited.value.code == 2 and len(err.splitlines()) == 1 and piece in err, err
