"""Training state on disk without pickle: tensors in safetensors, everything else in JSON, a manifest last.

Why: ``torch.load(weights_only=False)`` runs whatever the pickle inside says, so any file a client,
a colleague or a downloaded run can place where we read becomes code execution. Every state this
library writes and reads back (GRPO checkpoints, the local Tinker server's saves) goes through this
module: tensors into ``.safetensors`` (a header and raw bytes, nothing executable), optimizer
hyperparameters, schedulers and Python RNG state into JSON.

A save is a folder. ``write_manifest`` records every file's size and sha256 and is written last,
atomically; ``verify_manifest`` therefore tells an intact save from one a crash, a full disk or a
stray edit cut short, and the caller can fall back to an older save instead of crashing on it.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
_CHUNK = 1 << 20
_DIGESTS: dict[tuple[str, int, int, int], str] = {}
_DIGESTS_KEPT = 4096


def flatten_optimizer(
    state_dict: dict[str, Any], prefix: str = "optimizer"
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A torch optimizer ``state_dict`` as (tensors for safetensors, JSON-able rest)."""
    import torch

    tensors: dict[str, Any] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for index, entry in state_dict.get("state", {}).items():
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{prefix}.state.{index}.{key}"] = value.detach().cpu().contiguous().clone()
            else:
                scalars.setdefault(str(index), {})[key] = value
    return tensors, {"param_groups": state_dict.get("param_groups", []), "scalars": scalars}


def unflatten_optimizer(
    tensors: dict[str, Any], meta: dict[str, Any], prefix: str = "optimizer"
) -> dict[str, Any]:
    """The inverse of ``flatten_optimizer``: a ``state_dict`` that ``optimizer.load_state_dict`` takes."""
    state: dict[int | str, dict[str, Any]] = {}
    head = f"{prefix}.state."
    for name, tensor in tensors.items():
        if name.startswith(head):
            index, key = name.removeprefix(head).rsplit(".", 1)  # a parameter's name may hold dots
            state.setdefault(_state_key(index), {})[key] = tensor
    for index, entry in meta.get("scalars", {}).items():
        state.setdefault(_state_key(index), {}).update(entry)
    return {"state": state, "param_groups": meta.get("param_groups", [])}


def _state_key(index: str) -> int | str:
    """An optimizer state key: a parameter's position (torch's own state_dict) or its name (FSDP's)."""
    return int(index) if index.isdigit() else index


def rng_state() -> tuple[dict[str, Any], dict[str, Any]]:
    """Python's and torch's CPU RNG state as (tensors, JSON)."""
    import torch

    version, internal, gauss = random.getstate()
    return {"rng.torch": torch.get_rng_state()}, {"python": [version, list(internal), gauss]}


def set_rng_state(tensors: dict[str, Any], meta: dict[str, Any]) -> None:
    import torch

    version, internal, gauss = meta["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(tensors["rng.torch"])


def save_tensors(path: Path, tensors: dict[str, Any]) -> None:
    from safetensors.torch import save_file

    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(path))


def load_tensors(path: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(path))


def _sha256(path: Path) -> str:
    """The file's sha256, remembered for as long as its size, mtime and inode stay the same: a resume
    verifies the same checkpoint in validation and again when loading it, and a checkpoint of a real
    model is gigabytes."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, stat.st_ino)
    known = _DIGESTS.get(key)
    if known is not None:
        return known
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    if len(_DIGESTS) >= _DIGESTS_KEPT:
        _DIGESTS.clear()
    _DIGESTS[key] = digest.hexdigest()
    return _DIGESTS[key]


def write_manifest(directory: Path) -> None:
    """Record every file under ``directory`` (size, sha256); written last and atomically."""
    files = {
        str(p.relative_to(directory)): {"size": p.stat().st_size, "sha256": _sha256(p)}
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }
    staging = directory / f".{MANIFEST}.tmp"
    with staging.open("w") as fh:
        json.dump({"files": files}, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    staging.replace(directory / MANIFEST)


def verify_manifest(directory: Path) -> str | None:
    """None when every file the manifest lists is there with its size and hash; else what is wrong."""
    path = directory / MANIFEST
    try:
        files = json.loads(path.read_text())["files"]
    except FileNotFoundError:
        return "it has no manifest (the save never finished)"
    except (ValueError, KeyError, TypeError):
        return "its manifest is unreadable"
    for name, expected in files.items():
        file = directory / name
        if not file.is_file():
            return f"'{name}' is missing"
        if file.stat().st_size != expected.get("size"):
            return f"'{name}' has {file.stat().st_size} bytes, not {expected.get('size')}"
        if _sha256(file) != expected.get("sha256"):
            return f"'{name}' does not match its recorded hash"
    return None


CHECKPOINT_PREFIX = "step_"  # a checkpoint folder is <prefix><step, 6 digits>: names sort by step


def list_checkpoints(directory: Path) -> list[Path]:
    """The checkpoint folders in ``directory``, oldest first."""
    if not directory.exists():
        return []
    return sorted(p for p in directory.iterdir() if p.is_dir() and p.name.startswith(CHECKPOINT_PREFIX))


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
