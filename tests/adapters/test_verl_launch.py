"""The command ``backend=verl`` launches, on the machines users have: verl's own config validation
passes, rollout parallelism fits the visible GPUs, and the plugin verl loads fixes the trl probe."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from bridges.adapters.verl.launch import prepare
from bridges.runs.config import parse_config
from bridges.runs.train_config import TrainConfig


def composed(
    tmp_path: Path, gpus: int, monkeypatch: pytest.MonkeyPatch, *extra: str
) -> tuple[Any, dict[str, str]]:
    """verl's config tree for the command built with ``gpus`` visible, and the launch environment."""
    import torch
    import verl
    from hydra import compose, initialize_config_dir

    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    config = parse_config(TrainConfig, ["backend=verl", f"output_dir={tmp_path}", *extra])
    command, _, env = prepare(config)
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=command[3:]), env


def rollout_fits(cfg: Any) -> bool:
    """verl's assertion in ``ActorRolloutRefWorker.init_model``: the workers split into rollout replicas."""
    rollout = cfg.actor_rollout_ref.rollout
    infer = (
        rollout.tensor_model_parallel_size * rollout.data_parallel_size * rollout.pipeline_model_parallel_size
    )
    return (cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes) % infer == 0


@pytest.mark.parametrize("gpus", [0, 1, 8])
def test_the_command_passes_verls_own_validation_on_0_1_and_8_gpus(
    gpus: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    cfg, env = composed(tmp_path, gpus, monkeypatch)
    validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    assert rollout_fits(cfg)  # verl's default tensor parallelism (2) would not fit one GPU
    assert cfg.trainer.n_gpus_per_node == max(1, gpus)
    assert ("BRIDGES_VERL_CPU" in env) == (gpus == 0) and (cfg.trainer.device == "cpu") == (gpus == 0)
    assert env["VERL_USE_EXTERNAL_MODULES"].endswith("bridges.adapters.verl.plugin")


def test_tensor_parallelism_stays_overridable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    cfg, _ = composed(
        tmp_path, 8, monkeypatch, "engine=hf", "verl.actor_rollout_ref.rollout.tensor_model_parallel_size=4"
    )
    assert cfg.actor_rollout_ref.rollout.tensor_model_parallel_size == 4 and rollout_fits(cfg)


def test_the_plugin_tells_verl_trl_is_there_only_when_it_has_the_value_head_class():
    import trl
    from verl.utils import import_utils

    import bridges.adapters.verl.plugin as plugin

    assert plugin.trl_has_value_head() is hasattr(trl, "AutoModelForCausalLMWithValueHead")
    assert import_utils.is_trl_available is plugin.trl_has_value_head
    assert import_utils.is_trl_available() is False  # trl 1.x (our [dev] set) dropped the class verl imports
