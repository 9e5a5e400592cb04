"""The command ``backend=verl`` launches, on the machines users have: verl's own config validation
passes, rollout parallelism fits the visible GPUs, and the plugin verl loads fixes the trl probe."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
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


def validated(cfg: Any) -> None:
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))


@pytest.mark.parametrize("flash", [True, False], ids=["flash-attn", "no-flash-attn"])
def test_attention_and_remove_padding_are_chosen_together(flash: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Packed rows (remove-padding) need flash-attention's varlen kernels: under sdpa they would attend
    across sequences. Where flash_attn does not import, both are switched off together."""
    import importlib.util

    from bridges.adapters.verl import placement

    real = importlib.util.find_spec
    monkeypatch.setattr(placement.importlib.util, "find_spec",
                        lambda name, *a: (object() if flash else None) if name == "flash_attn" else real(name, *a))
    cfg, env = composed(tmp_path, 8, monkeypatch)
    validated(cfg)
    model = cfg.actor_rollout_ref.model
    assert model.use_remove_padding is flash and cfg.actor_rollout_ref.actor.use_remove_padding is flash
    assert model.override_config.attn_implementation == ("flash_attention_2" if flash else "sdpa")
    sentence = placement.attention(8)[1]
    assert sentence.startswith("verl attention: " + ("flash_attention_2 with" if flash else "sdpa without"))
    # on GPUs: micro-batches cut by tokens, and no CPU mode
    assert cfg.actor_rollout_ref.actor.use_dynamic_bsz and cfg.actor_rollout_ref.rollout.log_prob_use_dynamic_bsz
    assert "BRIDGES_VERL_CPU" not in env and cfg.trainer.device == "cuda"


def test_a_stale_cpu_flag_in_the_shell_is_not_forwarded_to_a_gpu_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("BRIDGES_VERL_CPU", "1")
    _, env = composed(tmp_path, 8, monkeypatch)
    assert "BRIDGES_VERL_CPU" not in env
    _, env = composed(tmp_path, 0, monkeypatch)
    assert env["BRIDGES_VERL_CPU"] == "1"


def test_rollout_tensor_parallelism_is_one_below_about_7b(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import json

    from bridges.adapters.verl.placement import parameter_count
    from bridges.models.tiny import resolve_model_path

    cfg, _ = composed(tmp_path, 8, monkeypatch, "engine=vllm")
    assert cfg.actor_rollout_ref.rollout.tensor_model_parallel_size == 1 and rollout_fits(cfg)
    big = tmp_path / "seven_b"  # Qwen2.5-7B's shape, config only: nothing is loaded
    big.mkdir()
    tiny = json.loads((Path(resolve_model_path("tiny")) / "config.json").read_text())
    (big / "config.json").write_text(json.dumps({**tiny, "hidden_size": 3584, "num_hidden_layers": 28,
                                                 "intermediate_size": 18944, "vocab_size": 152064, "num_attention_heads": 28,
                                                 "num_key_value_heads": 4, "head_dim": 128, "tie_word_embeddings": False}))
    assert 7.0e9 < parameter_count(str(big)) < 8.0e9
    from bridges.adapters.verl.placement import GpuLayout, placement_overrides

    config = parse_config(TrainConfig, ["backend=verl", "engine=vllm"])
    assert placement_overrides(config, GpuLayout(8, 1, "test"), big)["actor_rollout_ref.rollout.tensor_model_parallel_size"] == 2
    assert placement_overrides(config, GpuLayout(3, 1, "test"), big)["actor_rollout_ref.rollout.tensor_model_parallel_size"] == 1


def test_rollouts_that_do_not_divide_among_the_gpus_are_one_sentence(monkeypatch: pytest.MonkeyPatch, capsys):
    import torch

    from bridges.runs.config import run_cli
    from bridges.train import main

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 6)
    with pytest.raises(SystemExit) as exit_info:
        run_cli(main, ["backend=verl", "trainer.batch_size=8", "trainer.group_size=4", "dry_run=true"])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1, err
    assert "32 rollouts per step do not divide among verl's 6 GPUs (6 per node x 1 node(s), from this machine)" in err


@pytest.mark.parametrize("gpus", [0, 8])
def test_the_ratio_cap_is_verls_dual_clip_and_on_gpus_its_rollout_correction(
    gpus: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    cfg, _ = composed(tmp_path, gpus, monkeypatch, "trainer.ratio_cap=2.5")
    validated(cfg)
    assert cfg.actor_rollout_ref.actor.clip_ratio_c == 2.5
    correction = cfg.algorithm.rollout_correction
    if gpus:  # old logprobs recomputed by verl: the sampler's mismatch truncated at the same cap
        assert correction.rollout_is == "token" and correction.rollout_is_threshold == 2.5 and not correction.bypass_mode
    else:  # the sampler's logprobs are the old ones
        assert correction.rollout_is is None and correction.bypass_mode
    cfg, _ = composed(tmp_path, gpus, monkeypatch, "trainer.ratio_cap=null")
    assert cfg.actor_rollout_ref.actor.clip_ratio_c == 1e9 and cfg.algorithm.rollout_correction.rollout_is is None


def test_validation_groups_that_verl_would_split_between_workers_are_one_sentence(capsys):
    """val_kwargs.n > 1 on 8 eval rows: 4 agent-loop workers keep every group whole (accepted), 3 would
    cut one between two workers (refused before anything starts)."""
    from bridges.runs.config import run_cli
    from bridges.train import main

    grouped = ["backend=verl", "verl.actor_rollout_ref.rollout.val_kwargs.n=2", "verl.actor_rollout_ref.rollout.val_kwargs.do_sample=true"]
    with pytest.raises(SystemExit) as exit_info:
        run_cli(main, [*grouped, "verl.actor_rollout_ref.rollout.agent.num_workers=3", "trainer.batch_size=6",
                       "dry_run=true"])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1, err
    assert "val_kwargs.n=2 validates 8 eval rows on 3 agent-loop workers" in err
    with pytest.raises(SystemExit) as exit_info:
        run_cli(main, [*grouped, "verl.actor_rollout_ref.rollout.agent.num_workers=4", "trainer.batch_size=8",
                       "dry_run=true"])
    assert exit_info.value.code == 0 and "verl.trainer.main_ppo" in capsys.readouterr().out


def test_verl_validates_every_eval_every_steps_on_eval_examples_rows(tmp_path: Path, monkeypatch):
    import pandas as pd

    cfg, _ = composed(tmp_path, 0, monkeypatch, "eval_every=3", "eval_examples=5")
    assert cfg.trainer.test_freq == 3
    assert len(pd.read_parquet(tmp_path / "verl-repeat_letter" / "verl" / "eval.parquet")) == 5
    cfg, _ = composed(tmp_path, 0, monkeypatch, "overwrite=true")
    assert cfg.trainer.test_freq == -1  # off: verl validates once, before training


def test_a_verl_exit_quotes_its_first_error_and_offers_resume_only_with_a_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    """A cluster whose GPU the node cannot use: verl dies before a step, the cause deep in its log."""
    from bridges.adapters.verl.launch import finish

    run_dir = tmp_path / "r"
    (run_dir / "verl").mkdir(parents=True)
    (run_dir / "verl" / "console.log").write_text(
        "starting\n(TaskRunner pid=42) RuntimeError: Distributed package doesn't have NCCL built in\n"
        "...\nray.exceptions.RayTaskError(RuntimeError): echoed again at the end\n"
    )
    config = parse_config(TrainConfig, ["backend=verl", f"output_dir={tmp_path}", "run_name=r"])
    assert finish(config, run_dir, 0, 1) == 1
    said = capsys.readouterr().err.strip()
    assert said == (
        "verl's trainer exited with code 1 (its first error: RuntimeError: Distributed package doesn't have NCCL "
        "built in) after 0 steps and before it saved a checkpoint, so there is nothing to resume; its whole output "
        f"is in {run_dir / 'verl' / 'console.log'}."
    )
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("2")
    (run_dir / "verl" / "console.log").write_text("no traceback at all\n")
    assert finish(config, run_dir, 0, 1) == 1
    said = capsys.readouterr().err.strip()
    assert "names no error" in said and said.endswith("resume=true continues from its checkpoint of step 2.")


TRAINER_STAND_IN = """
import os, sys, time
from pathlib import Path
Path(sys.argv[1]).write_text(f"{os.getpid()}")
time.sleep(120)
"""

LAUNCHER = """
import os, sys
from pathlib import Path
from bridges.adapters.verl.console import run_verl
from bridges.runs.metrics import StepProgress
run_dir = Path(sys.argv[1])
env = {**os.environ, "VERL_FILE_LOGGER_PATH": str(run_dir / "rows.jsonl")}
run_verl([sys.executable, "-c", sys.argv[2], str(run_dir / "trainer.pid")], env, run_dir,
         StepProgress(False, 10, 0, "verl"))
"""


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
def test_nothing_of_verl_outlives_a_killed_launcher(tmp_path: Path, how: signal.Signals):
    """verl's trainer goes when ``bridges.train`` is killed, even by SIGKILL (the Ray processes that
    ``ray.init`` started share the trainer's fate: Ray's own rule, seen with the real one)."""
    (tmp_path / "verl").mkdir()
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(tmp_path), TRAINER_STAND_IN])
    pid_file = tmp_path / "trainer.pid"
    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and launcher.poll() is None, "the stand-in trainer never started"
        time.sleep(0.1)
    trainer = int(pid_file.read_text())
    os.kill(launcher.pid, how)
    launcher.wait(timeout=30)
    deadline = time.monotonic() + 30
    while _alive(trainer) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(trainer), "verl's trainer outlived the launcher"


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for init to reap it counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False
