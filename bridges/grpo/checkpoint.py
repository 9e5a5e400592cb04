"""Checkpoints that make ``resume=true`` continue exactly where a run stopped.

A checkpoint holds everything the next step depends on: weights (or the LoRA adapter), optimizer
and scheduler state, the step, the data position and every RNG. It is written to a temporary
folder and renamed into place, so a run killed mid-save never leaves a half checkpoint that a
resume would trust.
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

_PREFIX = "step_"


@dataclass
class TrainerState:
    step: int = 0  # optimizer steps completed
    data_position: int = 0  # rows consumed from the (seeded, reshuffled per epoch) training order


def _rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "torch": torch.get_rng_state()}


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(
    directory: Path,
    state: TrainerState,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    keep: int = 2,
    tokenizer: Any = None,
) -> Path:
    """Write a checkpoint atomically (staging folder, then rename); ``model/`` loads with from_pretrained
    on its own (the tokenizer is saved beside the weights), so any checkpoint is also a usable model."""
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"{_PREFIX}{state.step:06d}"
    staging = directory / f".tmp-{final.name}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    model.save_pretrained(staging / "model")
    if tokenizer is not None:
        tokenizer.save_pretrained(staging / "model")
    torch.save(
        {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": _rng_state()},
        staging / "trainer.pt",
    )
    (staging / "state.json").write_text(json.dumps(asdict(state)))
    shutil.rmtree(final, ignore_errors=True)
    staging.rename(final)
    for old in list_checkpoints(directory)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(directory: Path) -> list[Path]:
    if not directory.exists():
        return []
    return sorted(p for p in directory.iterdir() if p.is_dir() and p.name.startswith(_PREFIX))


def latest_checkpoint(directory: Path) -> Path | None:
    found = list_checkpoints(directory)
    return found[-1] if found else None


def load_checkpoint(
    path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any
) -> TrainerState:
    """Restore weights, optimizer, scheduler and RNG in place; return the trainer state."""
    from safetensors.torch import load_file

    weights = sorted((path / "model").glob("*.safetensors"))
    if not weights:
        raise FileNotFoundError(f"checkpoint {path} has no weights under model/; it cannot be resumed.")
    state_dict: dict[str, torch.Tensor] = {}
    for file in weights:
        state_dict.update(load_file(str(file)))
    if hasattr(model, "peft_config"):
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, state_dict)
    else:
        missing, unexpected = model.load_state_dict(state_dict, strict=False)
        tied = {k for k in missing if "lm_head" in k}
        if set(missing) - tied or unexpected:
            raise RuntimeError(
                f"checkpoint {path} does not match the model (missing {missing}, unexpected {unexpected})."
            )
    blob = torch.load(path / "trainer.pt", weights_only=False)
    optimizer.load_state_dict(blob["optimizer"])
    scheduler.load_state_dict(blob["scheduler"])
    _set_rng_state(blob["rng"])
    return TrainerState(**json.loads((path / "state.json").read_text()))
