"""A verl actor checkpoint (sharded FSDP states under ``checkpoints/global_step_N/actor``) merged into one
Hugging Face folder by verl's own merger, for ``python -m bridges.export model=<verl run>``."""

from __future__ import annotations

from pathlib import Path

from bridges.runtime.errors import ConfigError, require_extra


def merge_actor(actor: Path, staging: Path) -> None:
    """verl's own merger over its FSDP shards (``python -m verl.model_merger merge`` in a call)."""
    require_extra("verl", "verl", "exporting a verl checkpoint")
    from verl.model_merger.base_model_merger import ModelMergerConfig
    from verl.model_merger.fsdp_model_merger import FSDPModelMerger

    if not list(actor.glob("model_world_size_*_rank_*.pt")):
        raise ConfigError(
            f"{actor} holds no FSDP shards (model_world_size_*); a Megatron checkpoint is merged by "
            "python -m verl.model_merger merge --backend megatron."
        )
    config = ModelMergerConfig(operation="merge", backend="fsdp", local_dir=str(actor), target_dir=str(staging),
                               hf_model_config_path=str(actor / "huggingface"))
    merger = FSDPModelMerger(config)
    merger.merge_and_save()
    merger.cleanup()
