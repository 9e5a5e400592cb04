"""A trained model out of a run (``python -m bridges.export model=<run> output=<folder>``): one Hugging
Face folder that ``from_pretrained`` loads on its own, optionally pushed to the Hub.

Why a command: each backend saves its own way — the bundled trainer ``checkpoints/step_N/model`` (full
weights or a LoRA adapter, beside optimizer state a model user does not want), TRL and ``bridges.sft``
``checkpoint-N`` and ``final`` folders, verl sharded FSDP states under ``checkpoints/global_step_N/actor``
— and a user who trained wants the model, not a map of those layouts. A LoRA adapter is merged into its
base by default (a folder that needs peft and the base to load is not a model); ``merge_lora=false``
keeps the adapter. Tinker keeps its weights on its service: its runs hold no weights to export.

Left out: sharding a huge model into several uploads (``upload_folder`` handles large files), model
cards, and Megatron checkpoints (verl's merger takes them: ``python -m verl.model_merger merge``).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from bridges.runtime.errors import ConfigError

_HF_CHECKPOINT = re.compile(r"checkpoint-(\d+)")
_VERL_STEP = re.compile(r"global_step_(\d+)")


def is_model_folder(path: Path) -> bool:
    """A folder ``from_pretrained`` reads: full weights (``config.json``) or a peft adapter."""
    return (path / "config.json").is_file() or (path / "adapter_config.json").is_file()


def find_trained_model(path: Path) -> tuple[Path, str]:
    """(the folder holding the newest usable weights under ``path``, its kind: ``hf`` or ``verl``).

    ``path`` may be a run folder, its ``checkpoints/`` folder, one checkpoint, or a model folder.
    The bundled trainer's checkpoints are verified against their manifest and a damaged newest one is
    skipped with a note, as ``resume=true`` does."""
    from bridges.runtime.state_files import intact_checkpoints, list_checkpoints, verify_manifest

    if not path.is_dir():
        raise ConfigError(f"model={path} is not a folder; give a run folder, a checkpoint or a model folder.")
    if is_model_folder(path):
        return path, "hf"
    if (path / "final").is_dir() and is_model_folder(path / "final"):  # bridges.sft's last model
        return path / "final", "hf"
    if (path / "checkpoints").is_dir():
        return find_trained_model(path / "checkpoints")
    if (path / "model").is_dir() and (path / "manifest.json").is_file():  # one bundled-trainer checkpoint
        problem = verify_manifest(path)
        if problem is not None:
            raise ConfigError(f"checkpoint {path} is damaged ({problem}); export another one or the run folder.")
        return path / "model", "hf"
    if list_checkpoints(path):
        intact, damaged = intact_checkpoints(path)
        for note in damaged:
            print(f"skipped: {note}")
        if not intact:
            raise ConfigError(f"no checkpoint in {path} is intact ({'; '.join(damaged)}).")
        return intact[0] / "model", "hf"
    newest = _newest(path, _HF_CHECKPOINT)
    if newest is not None and is_model_folder(newest):
        return newest, "hf"
    newest = _newest(path, _VERL_STEP) if _VERL_STEP.fullmatch(path.name) is None else path
    if newest is not None and (newest / "actor").is_dir():
        return newest / "actor", "verl"
    if path.name == "actor" and (path / "huggingface").is_dir():
        return path, "verl"
    raise ConfigError(
        f"found no trained model under {path}: give a run folder (a Tinker run keeps its weights on Tinker's "
        "service), its checkpoints/ folder, one checkpoint, or a folder holding config.json."
    )


def _newest(folder: Path, pattern: re.Pattern[str]) -> Path | None:
    steps = [(int(m.group(1)), p) for p in folder.iterdir() if p.is_dir() and (m := pattern.fullmatch(p.name))]
    return max(steps)[1] if steps else None


def write_model(source: Path, kind: str, staging: Path, merge_lora: bool) -> str:
    """Write the loadable folder into ``staging``; returns what was written, in a few words."""
    if kind == "verl":
        from bridges.adapters.verl.merge import merge_actor

        merge_actor(source, staging)
        return "verl's sharded actor merged into full weights"
    if not (source / "adapter_config.json").is_file():
        shutil.copytree(source, staging)
        return "full weights"
    if not merge_lora:
        shutil.copytree(source, staging)
        return "a LoRA adapter (merge_lora=false: load it with peft on its base model)"
    _merge_adapter(source, staging)
    return "a LoRA adapter merged into its base model"


def _merge_adapter(adapter: Path, staging: Path) -> None:
    """The adapter folded into its base's weights (peft's ``merge_and_unload``), with the tokenizer."""
    import json

    from bridges.runs.preflight import check_model
    from bridges.runtime.errors import require_extra

    base = json.loads((adapter / "adapter_config.json").read_text()).get("base_model_name_or_path") or ""
    check_model(base)  # a base the Hub cannot give is one sentence, before anything loads
    peft = require_extra("peft", "trl", "merging a LoRA adapter")
    from transformers import AutoTokenizer

    model = peft.AutoPeftModelForCausalLM.from_pretrained(str(adapter), dtype="auto")
    model.merge_and_unload().save_pretrained(staging)
    source = adapter if (adapter / "tokenizer_config.json").is_file() else base
    AutoTokenizer.from_pretrained(str(source)).save_pretrained(staging)


def push_folder(folder: Path, repo: str, private: bool) -> None:
    """Upload ``folder`` as the model repo ``repo`` (created if missing); the token is the environment's
    (``HF_TOKEN``) or the one ``hf auth login`` stored, as huggingface_hub reads it."""
    from huggingface_hub import HfApi

    api = HfApi()
    try:
        api.create_repo(repo, repo_type="model", private=private, exist_ok=True)
        api.upload_folder(folder_path=str(folder), repo_id=repo, repo_type="model",
                          commit_message="Upload a model trained with rl-bridges")
    except Exception as exc:  # no token, no network, no access: the local copy is already saved
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise ConfigError(
            f"saved locally, but pushing to {repo} failed ({type(exc).__name__}: {first[:200]}); "
            "check that HF_TOKEN holds a token with write access and the Hub is reachable, then export again."
        ) from None
