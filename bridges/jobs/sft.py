"""Supervised fine-tuning on exported rollouts through TRL (``python -m bridges.sft``): the run's checks
before anything loads, then ``bridges.adapters.trl.sft``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bridges.runs.config import option
from bridges.runs.train_config import TrainerConfig, ignored_key
from bridges.runtime.errors import ConfigError

SFT_TRAINER_KEYS = frozenset(f"trainer.{key}" for key in (
    "max_steps", "batch_size", "learning_rate", "warmup_steps", "weight_decay", "max_grad_norm",
    "grad_accum_steps", "lora_rank", "lora_alpha", "lora_dropout", "lora_target_modules",
    "device", "dtype", "gradient_checkpointing",
))


@dataclass
class SFTRunConfig:
    data: str = option("", help="a dataset folder from bridges.export (input_ids + assistant_masks)")
    model: str = option("tiny", help="'tiny', 'tiny-<family>', a local checkpoint folder or a hub id")
    run_name: str | None = option(None, help="the run's folder under output_dir; default sft-<data folder>")
    output_dir: str = option("runs", help="where run folders are written")
    seed: int = option(0, ge=0, help="seed of data order and initialisation")
    resume: bool = option(False, help="continue the run in <output_dir>/<run_name> from its last checkpoint")
    overwrite: bool = option(False, help="replace the run already in <output_dir>/<run_name>")
    save_every: int = option(0, ge=0, help="steps between checkpoints; 0 = only at the end")
    keep_checkpoints: int = option(2, ge=0, help="newest checkpoints kept; 0 = keep all")
    max_length: int = option(2048, ge=1, help="sequences are truncated to this many tokens")
    progress: bool = option(True, help="a progress bar")
    trainer: TrainerConfig = option(factory=TrainerConfig, help="the shared training keys (those SFT uses)")
    sft: dict[str, Any] = option(factory=dict, help="TRL SFTConfig fields, passed through")

    @property
    def resolved_run_name(self) -> str:
        return self.run_name or f"sft-{Path(self.data.rstrip('/')).name or 'data'}"


def validate(config: SFTRunConfig) -> Path:
    """Every check that needs no model; returns the run folder."""
    from bridges.models.hardware import check_device
    from bridges.runs.config import check_passthrough
    from bridges.runs.preflight import check_model, check_run_name, check_writable_folder, claim_run_folder
    from bridges.runtime.errors import require_extra

    ignored = ignored_key(config.trainer, "trainer", SFT_TRAINER_KEYS)
    if ignored is not None:
        raise ConfigError(f"bridges.sft does not use {ignored[0]} (set to {ignored[1]}); remove it.")
    if not config.data:
        raise ConfigError("give data=<a dataset folder written by bridges.export>.")
    if config.trainer.gradient_checkpointing not in ("off", "full"):  # TRL's SFTTrainer: all layers or none
        raise ConfigError(f"bridges.sft recomputes every decoder layer or none (TRL's trainer), so "
                          f"trainer.gradient_checkpointing={config.trainer.gradient_checkpointing} cannot hold; "
                          "set it to full or off.")
    _check_dataset(Path(config.data))
    check_model(config.model)
    check_device(config.trainer.device, "trainer.device")
    check_run_name(config.resolved_run_name)
    check_writable_folder(Path(config.output_dir), "output_dir")
    trl = require_extra("trl", "trl", "bridges.sft")
    check_passthrough(
        config.sft, {f.name: f.type for f in dataclasses.fields(trl.SFTConfig)}, "sft.", "SFTConfig"
    )
    run_dir = Path(config.output_dir) / config.resolved_run_name
    claim_run_folder(run_dir, resume=config.resume, overwrite=config.overwrite, dry_run=False)
    return run_dir


def _check_dataset(path: Path) -> None:
    from datasets import load_from_disk

    try:
        columns = load_from_disk(str(path)).column_names
    except (FileNotFoundError, ValueError, OSError) as exc:
        raise ConfigError(
            f"data={path} is not a saved dataset ({type(exc).__name__}); write one with bridges.export."
        ) from None
    missing = {"input_ids", "assistant_masks"} - set(columns)
    if missing:
        raise ConfigError(f"data={path} lacks {', '.join(sorted(missing))}; write it with bridges.export.")


def fine_tune(config: SFTRunConfig) -> int:
    """Check everything that needs no model, then train through TRL's SFTTrainer."""
    run_dir = validate(config)
    from bridges.adapters.trl.sft import run_sft

    return run_sft(config, run_dir)
