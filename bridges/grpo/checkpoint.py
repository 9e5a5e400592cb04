"""Checkpoints that make ``resume=true`` continue exactly where a run stopped, and never run code.

A checkpoint holds everything the next step depends on: weights (or the LoRA adapter), optimizer
and scheduler state, the step, the data position and every RNG. Tensors are safetensors and the
rest JSON (``bridges.state_files``): a checkpoint folder someone hands you cannot execute anything
when resumed. It is written to a staging folder with a manifest (sizes, sha256) written last, then
renamed into place; resume verifies the manifest and falls back to the newest intact checkpoint,
so a save cut by a crash or a full disk costs the steps since the one before, not the run.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from bridges.errors import ConfigError
from bridges.state_files import (
    flatten_optimizer,
    load_tensors,
    rng_state,
    save_tensors,
    set_rng_state,
    unflatten_optimizer,
    verify_manifest,
    write_manifest,
)
from bridges.workflows.run_loop import RunPosition

_PREFIX = "step_"
TRAINER_TENSORS = "trainer.safetensors"
TRAINER_META = "trainer.json"


def save_checkpoint(
    directory: Path,
    state: RunPosition,
    model: Any,  # a transformers or peft model: save_pretrained
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    keep: int = 2,
    tokenizer: Any = None,
) -> Path:
    """Write a checkpoint atomically (staging folder, manifest last, then rename); ``model/`` loads with
    from_pretrained on its own (the tokenizer is saved beside the weights), so any checkpoint is also a
    usable model."""
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"{_PREFIX}{state.step:06d}"
    staging = directory / f".tmp-{final.name}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    model.save_pretrained(staging / "model")
    if tokenizer is not None:
        tokenizer.save_pretrained(staging / "model")
    optim_tensors, optim_meta = flatten_optimizer(optimizer.state_dict())
    rng_tensors, rng_meta = rng_state()
    save_tensors(staging / TRAINER_TENSORS, {**optim_tensors, **rng_tensors})
    meta = {"optimizer": optim_meta, "scheduler": scheduler.state_dict(), "rng": rng_meta}
    (staging / TRAINER_META).write_text(json.dumps(meta))
    (staging / "state.json").write_text(json.dumps(asdict(state)))
    write_manifest(staging)
    shutil.rmtree(final, ignore_errors=True)
    staging.rename(final)
    for old in list_checkpoints(directory)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(directory: Path) -> list[Path]:
    if not directory.exists():
        return []
    return sorted(p for p in directory.iterdir() if p.is_dir() and p.name.startswith(_PREFIX))


def intact_checkpoints(directory: Path) -> tuple[list[Path], list[str]]:
    """Checkpoints whose manifest verifies, newest first, and one sentence per damaged one skipped."""
    intact, damaged = [], []
    for path in reversed(list_checkpoints(directory)):
        problem = verify_manifest(path)
        if problem is None:
            intact.append(path)
        else:
            damaged.append(f"checkpoint {path.name} is damaged ({problem})")
    return intact, damaged


def no_intact_checkpoint(directory: Path, damaged: list[str]) -> ConfigError:
    return ConfigError(
        f"resume=true but no checkpoint in {directory} is intact ({'; '.join(damaged)}); "
        "pass overwrite=true to start the run again."
    )


def is_adapter_checkpoint(path: Path) -> bool:
    """Whether the checkpoint holds a LoRA adapter (peft's adapter_config.json) rather than full weights."""
    return (path / "model" / "adapter_config.json").exists()


def load_checkpoint(
    path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any
) -> RunPosition:
    """Restore weights, optimizer, scheduler and RNG in place; return the trainer state."""
    weights = sorted((path / "model").glob("*.safetensors"))
    if not weights:
        raise FileNotFoundError(f"checkpoint {path} has no weights under model/; it cannot be resumed.")
    state_dict: dict[str, torch.Tensor] = {}
    for file in weights:
        state_dict.update(load_tensors(file))
    if hasattr(model, "peft_config"):
        from bridges.errors import require_extra

        require_extra("peft", "trl", "LoRA checkpoints").set_peft_model_state_dict(model, state_dict)
    else:
        missing, unexpected = model.load_state_dict(state_dict, strict=False)
        tied = {k for k in missing if "lm_head" in k}
        if set(missing) - tied or unexpected:
            raise RuntimeError(
                f"checkpoint {path} does not match the model (missing {missing}, unexpected {unexpected})."
            )
    tensors = load_tensors(path / TRAINER_TENSORS)
    meta = json.loads((path / TRAINER_META).read_text())
    optimizer.load_state_dict(unflatten_optimizer(tensors, meta["optimizer"]))
    scheduler.load_state_dict(meta["scheduler"])
    set_rng_state(tensors, meta["rng"])
    return RunPosition(**json.loads((path / "state.json").read_text()))


def resume_latest_intact(
    directory: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any
) -> tuple[RunPosition, Path] | None:
    """Load the newest checkpoint that verifies and loads, saying which damaged ones were skipped;
    None when there is no checkpoint at all. Every checkpoint damaged is one sentence (ConfigError)."""
    from bridges.asyncutils import describe_exception

    if not list_checkpoints(directory):
        return None
    intact, damaged = intact_checkpoints(directory)
    for note in damaged:
        print(f"{note}; skipping it.")
    for path in intact:
        try:
            return load_checkpoint(path, model, optimizer, scheduler), path
        except Exception as exc:  # verified bytes that still do not load: try the one before
            note = f"checkpoint {path.name} could not be loaded ({describe_exception(exc)})"
            damaged.append(note)
            print(f"{note}; skipping it.")
    raise no_intact_checkpoint(directory, damaged)
