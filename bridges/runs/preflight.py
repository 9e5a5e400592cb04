"""Checks a run's inputs before anything heavy loads: the environment, its data, the model, the folders.

Why a separate step: a bad value found after a model has loaded (or after Ray has started) wastes
minutes and usually surfaces as a traceback deep inside a backend. The CLIs run these checks right
after parsing, in seconds, each failure one sentence (``ConfigError``, exit 2); ``dry_run=true``
runs exactly the same checks. None of them writes anything, except ``claim_run_folder`` which
empties a folder only when the user asked for ``overwrite=true``.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from bridges.runtime.asyncutils import describe_exception
from bridges.runtime.errors import BridgesError, ConfigError

_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
HUB_TIMEOUT_S = 10.0  # one metadata request: a reachable Hub answers well within it
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")
# what makes a folder a run: a run started into it would truncate or append to these
RUN_FILES = ("metrics.jsonl", "traces.jsonl.gz", "traces.jsonl", "checkpoints", "checkpoints.jsonl")


def build_environment(env_id: str, env_args: dict[str, Any]) -> Any:
    """The environment, or one sentence: unknown id (with the closest bundled one), arguments its loader
    does not take, or any failure while building it."""
    import datasets

    from bridges.envs.registry import load_environment

    datasets.disable_progress_bars()  # the rollout bar is the one that matters
    try:
        return load_environment(env_id, **env_args)
    except BridgesError:
        raise
    except TypeError as exc:
        if "argument" in str(exc):
            raise ConfigError(f"environment '{env_id}' does not accept these env_args ({exc}).") from None
        raise ConfigError(f"environment '{env_id}' could not be built: {describe_exception(exc)}") from None
    except Exception as exc:
        raise ConfigError(f"environment '{env_id}' could not be built: {describe_exception(exc)}") from None


def check_dataset(env: Any, split: str, env_id: str) -> None:
    """The split a run reads must have rows (an empty one would run zero steps and exit 0), and every
    row a prompt a rollout can start from (``check_prompts``), before anything heavy loads."""
    from bridges.envs.base import check_prompts

    dataset = env.get_eval_dataset() if split == "eval" else env.get_dataset()
    if len(dataset) == 0:
        raise ConfigError(f"environment '{env_id}' has an empty {split} dataset; check its env_args.")
    check_prompts(dataset, f"the {split} dataset of environment '{env_id}'")
    from bridges.envs.rubric import Rubric

    if isinstance(env.rubric, Rubric):  # a verifiers environment's rubric is verifiers' own, called its way
        env.rubric.check_parameters(list(dataset.column_names))


def check_eval_split(env: Any, env_id: str) -> None:
    """``eval_every`` evaluates on held-out rows: an environment without an eval split would evaluate on
    its training rows (``get_eval_dataset`` falls back to them), which is no evaluation at all."""
    if env.eval_dataset is None:
        raise ConfigError(
            f"eval_every is set but environment '{env_id}' has no eval split (its training rows are not held "
            "out); build it with eval_dataset=, or set eval_every=0."
        )
    check_dataset(env, "eval", env_id)


def check_model(model: str) -> None:
    """``tiny``/``tiny-<family>``, a local model folder, or something shaped like a hub id (cached when offline)."""
    from bridges.models.tiny import is_builtin_model

    if is_builtin_model(model):
        return
    path = Path(model).expanduser()
    if path.exists():
        if path.is_dir() and (path / "metrics.jsonl").is_file() and not (path / "config.json").is_file():
            raise ConfigError(
                f"model '{model}' is a training run's folder, not a model folder; export its weights first "
                f"(python -m bridges.export model={model} output=models/{path.name}), then pass model=models/{path.name}."
            )
        if not path.is_dir() or not (path / "config.json").is_file():
            raise ConfigError(f"model '{model}' is not a model folder (it has no config.json).")
        return
    if model.startswith((".", "/", "~")) or ".." in model or not _HUB_ID.fullmatch(model):
        raise ConfigError(f"model '{model}' does not exist: it is not 'tiny', a local folder or a hub id.")
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(model, "config.json"), str):
        return
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        raise ConfigError(
            f"model '{model}' is neither a local folder nor in the Hugging Face cache, and HF_HUB_OFFLINE "
            "is set; pass a local checkpoint folder."
        )
    _check_on_hub(model)


@functools.cache  # a run checks its model in its backend's checks and again for the template verdict
def _check_on_hub(model: str) -> None:
    """A hub id that is not cached must be reachable and exist, asked once here, so a dry run and a real
    run stop on the same sentence (a real run used to die in ``from_pretrained`` with a traceback). Only
    a model found is remembered: a refusal raises, and raising is never cached."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        HfApi().model_info(model, timeout=HUB_TIMEOUT_S)
    except GatedRepoError:
        raise ConfigError(
            f"model '{model}' is gated on the Hugging Face Hub; accept its terms there and set HF_TOKEN, "
            "or pass a local checkpoint folder."
        ) from None
    except RepositoryNotFoundError:
        raise ConfigError(
            f"model '{model}' is not on the Hugging Face Hub (or is private: set HF_TOKEN); check the id "
            "or pass a local checkpoint folder."
        ) from None
    except Exception as exc:  # no network, DNS, a proxy, a timeout
        raise ConfigError(
            f"model '{model}' is not in the Hugging Face cache and the Hub cannot be reached "
            f"({describe_exception(exc)[:160]}); pass a local checkpoint folder, or download it where the Hub is "
            "reachable and set HF_HUB_OFFLINE=1."
        ) from None


def check_lora_targets(model: str, targets: list[str]) -> None:
    """LoRA's target modules exist in the model, checked on an empty (meta-device) copy built from its
    config alone, so no weights load; peft's own error would come only after the model loaded."""
    if not targets:
        raise ConfigError(
            "trainer.lora_target_modules is empty; name the modules LoRA adapts (e.g. [q_proj,v_proj])."
        )
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from bridges.models.tiny import resolve_model_path

    config = AutoConfig.from_pretrained(resolve_model_path(model))
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    present = {name.rsplit(".", 1)[-1] for name, _ in skeleton.named_modules()}
    missing = sorted(set(targets) - present)
    if missing:
        linear = sorted(
            n for n in present if n.endswith("proj") or n in ("lm_head", "c_attn", "c_proj", "fc1", "fc2")
        )
        raise ConfigError(
            f"trainer.lora_target_modules names {', '.join(missing)}, which model '{model}' does not have; "
            f"its projection modules are {', '.join(linear) or 'none'}."
        )


def check_writable_folder(path: Path, key: str) -> None:
    """``path`` is a folder, or can be made one, that this process can write to (nothing is created)."""
    existing = path
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        where = "" if existing == path else f" ('{existing}' is a file)"
        raise ConfigError(f"{key}='{path}' cannot be a folder{where}; choose another {key}.")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        raise ConfigError(
            f"{key}='{path}' is not writable ({exc.strerror or exc}); choose another {key}."
        ) from None


def check_run_name(name: str) -> None:
    """A run name is one folder name: never a path that could leave ``output_dir``."""
    if not _PLAIN_NAME.fullmatch(name) or ".." in name:
        raise ConfigError(
            f"run_name '{name}' must be one folder name (letters, digits, '.', '_', '+', '-'; no '/' or '..')."
        )


def claim_run_folder(run_dir: Path, *, resume: bool, overwrite: bool, dry_run: bool) -> None:
    """Refuse to start a new run on top of an old one; ``overwrite=true`` empties it first (not in a dry run)."""
    if resume and overwrite:
        raise ConfigError("resume=true and overwrite=true contradict each other; pass one of them.")
    holds_run = run_dir.is_dir() and any((run_dir / name).exists() for name in RUN_FILES)
    if not holds_run or resume:
        return
    if not overwrite:
        raise ConfigError(
            f"'{run_dir}' already holds a run; pass resume=true to continue it, overwrite=true to replace it, "
            "or another run_name=."
        )
    if not dry_run:
        shutil.rmtree(run_dir)
