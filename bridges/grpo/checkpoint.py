"""Checkpoints that make ``resume=true`` continue exactly where a run stopped, and never run code.

A checkpoint holds everything the next step depends on: weights (or the LoRA adapter), optimizer
and scheduler state, the step, the data position and every RNG. Tensors are safetensors and the
rest JSON (``bridges.runtime.state_files``): a checkpoint folder someone hands you cannot execute anything
when resumed. It is written to a staging folder with a manifest (sizes, sha256) written last, then
renamed into place; resume verifies the manifest and falls back to the newest intact checkpoint,
so a save cut by a crash or a full disk costs the steps since the one before, not the run.

``model/`` is the usable model (in the dtype its parameters are kept in: the half dtype, or fp32 under
FSDP, whose sharded parameters are the masters); resume reads ``trainable.safetensors``,
the exact fp32 value of every trained tensor by name (the masters of a half-precision run, whose
``model/`` weights have lost their low bits). With several processes everything is gathered whole
onto the main process's CPU (``parallel.checkpoint_state``: never whole on a GPU) and it alone writes, so a checkpoint is one folder whatever the number of processes and
resumes under another number; the optimizer state is keyed by position (``ddp``: every process holds
it all) or by tensor name (``fsdp``: gathered from its shards), and a resume under the other strategy
is refused in one sentence.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from bridges.grpo.parallel import (
    ONE_PROCESS,
    World,
    barrier,
    checkpoint_state,
    load_full_state,
    load_optimizer_state,
)
from bridges.grpo.policy import trainable_names
from bridges.grpo.precision import DynamicLossScale, MasterWeights
from bridges.runtime.errors import ConfigError
from bridges.runtime.state_files import CHECKPOINT_PREFIX as _PREFIX
from bridges.runtime.state_files import (
    flatten_optimizer,
    intact_checkpoints,
    list_checkpoints,
    load_tensors,
    rng_state,
    save_tensors,
    set_rng_state,
    unflatten_optimizer,
    write_manifest,
)
from bridges.workflows.run_loop import RunPosition

TRAINER_TENSORS = "trainer.safetensors"
TRAINABLE_TENSORS = "trainable.safetensors"
TRAINER_META = "trainer.json"


def save_checkpoint(
    directory: Path,
    state: RunPosition,
    model: Any,  # a transformers or peft model (FSDP2-sharded or not)
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    master: MasterWeights,
    world: World = ONE_PROCESS,
    keep: int = 2,
    tokenizer: Any = None,
    scaler: DynamicLossScale | None = None,
) -> Path | None:
    """Write a checkpoint atomically (staging folder, manifest last, then rename); ``model/`` loads with
    from_pretrained on its own (the tokenizer is saved beside the weights). Every process calls it (the
    gathering is collective); the main one receives everything on its CPU, writes, and returns the folder."""
    gathered = checkpoint_state(model, optimizer, world)
    final = directory / f"{_PREFIX}{state.step:06d}"
    if gathered is not None:
        full, optim_state = gathered
        trained = {**{n: full[n] for n in trainable_names(model)}, **master.named_state()}
        directory.mkdir(parents=True, exist_ok=True)
        staging = directory / f".tmp-{final.name}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        model.save_pretrained(staging / "model", state_dict=full)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging / "model")
        save_tensors(staging / TRAINABLE_TENSORS, {k: v.to(torch.float32) for k, v in trained.items()})
        optim_tensors, optim_meta = flatten_optimizer(optim_state)
        rng_tensors, rng_meta = rng_state()
        save_tensors(staging / TRAINER_TENSORS, {**optim_tensors, **rng_tensors})
        meta = {"optimizer": optim_meta, "scheduler": scheduler.state_dict(), "rng": rng_meta,
                "optimizer_keys": "name" if world.sharded else "position",
                "loss_scale": scaler.state_dict() if scaler is not None else {}}
        (staging / TRAINER_META).write_text(json.dumps(meta))
        (staging / "state.json").write_text(json.dumps(asdict(state)))
        write_manifest(staging)
        shutil.rmtree(final, ignore_errors=True)
        staging.rename(final)
        for old in list_checkpoints(directory)[:-keep] if keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    barrier(world)  # [distributed] nobody goes on (or reads the checkpoint) before it is whole
    return final if world.is_main else None


def no_intact_checkpoint(directory: Path, damaged: list[str]) -> ConfigError:
    return ConfigError(
        f"resume=true but no checkpoint in {directory} is intact ({'; '.join(damaged)}); "
        "pass overwrite=true to start the run again."
    )


def is_adapter_checkpoint(path: Path) -> bool:
    """Whether the checkpoint holds a LoRA adapter (peft's adapter_config.json) rather than full weights."""
    return (path / "model" / "adapter_config.json").exists()


def load_checkpoint(
    path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
    master: MasterWeights, world: World = ONE_PROCESS, scaler: DynamicLossScale | None = None,
) -> RunPosition:
    """Restore weights (and masters), optimizer, scheduler and RNG in place; return the trainer state."""
    meta = json.loads((path / TRAINER_META).read_text())
    check_strategy(path, meta, world.sharded)
    trained = _trained_tensors(path, model)
    load_full_state(model, trained)
    master.load_named_state(trained)
    tensors = load_tensors(path / TRAINER_TENSORS)
    load_optimizer_state(model, optimizer, unflatten_optimizer(tensors, meta["optimizer"]), world)
    scheduler.load_state_dict(meta["scheduler"])
    if scaler is not None:
        scaler.load_state_dict(meta.get("loss_scale", {}))
    set_rng_state(tensors, meta["rng"])
    return RunPosition(**json.loads((path / "state.json").read_text()))


def check_strategy(path: Path, meta: dict[str, Any] | None, sharded: bool) -> None:
    """A checkpoint's optimizer state is keyed by position (one process, or ddp) or by name (fsdp): one
    sentence when the run resuming it would read the other kind."""
    if meta is None:  # a checkpoint without trainer state has no optimizer state to misread
        meta_file = path / TRAINER_META
        meta = json.loads(meta_file.read_text()) if meta_file.exists() else {}
    keys = meta.get("optimizer_keys", "position")
    if keys != ("name" if sharded else "position"):
        wrote, now = ("fsdp on several processes", "ddp") if keys == "name" else ("ddp", "fsdp")
        raise ConfigError(
            f"checkpoint {path.name} was written with trainer.strategy={wrote}, whose optimizer state "
            f"trainer.strategy={now} cannot read; resume with the strategy the run was started with."
        )


def _trained_tensors(path: Path, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The trained tensors by name: ``trainable.safetensors``, or (a checkpoint from before it existed)
    the weights in ``model/`` (a peft adapter's names given back their adapter name)."""
    if (path / TRAINABLE_TENSORS).exists():
        return load_tensors(path / TRAINABLE_TENSORS)
    weights = sorted((path / "model").glob("*.safetensors"))
    if not weights:
        raise FileNotFoundError(f"checkpoint {path} has no weights under model/; it cannot be resumed.")
    state: dict[str, torch.Tensor] = {}
    for file in weights:
        state.update(load_tensors(file))
    names = trainable_names(model)
    if names and all(".default." in n for n in names):  # peft saves adapter tensors without "default"
        state = {k.replace(".weight", ".default.weight"): v for k, v in state.items()}
    unknown = set(state) - set(dict(model.named_parameters())) - {k for k in state if "lm_head" in k}
    if unknown:
        raise RuntimeError(f"checkpoint {path} does not match the model (unexpected {sorted(unknown)[:3]}).")
    return state


def resume_latest_intact(
    directory: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
    master: MasterWeights, world: World = ONE_PROCESS, scaler: DynamicLossScale | None = None,
) -> tuple[RunPosition, Path] | None:
    """Load the newest checkpoint that verifies and loads, saying which damaged ones were skipped;
    None when there is no checkpoint at all. Every checkpoint damaged is one sentence (ConfigError)."""
    from bridges.runtime.asyncutils import describe_exception

    if not list_checkpoints(directory):
        return None
    intact, damaged = intact_checkpoints(directory)
    say = print if world.is_main else (lambda *_: None)
    for note in damaged:
        say(f"{note}; skipping it.")
    for path in intact:
        try:
            return load_checkpoint(path, model, optimizer, scheduler, master, world, scaler), path
        except ConfigError:
            raise
        except Exception as exc:  # verified bytes that still do not load: try the one before
            note = f"checkpoint {path.name} could not be loaded ({describe_exception(exc)})"
            damaged.append(note)
            say(f"{note}; skipping it.")
    raise no_intact_checkpoint(directory, damaged)
