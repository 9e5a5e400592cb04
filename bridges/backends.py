"""Backend registry: ``backend=<name>`` -> the function that runs a training job.

Names map to dotted paths so no backend library is imported until that backend is chosen, and
third parties add a backend through the ``rl_bridges.backends`` entry-point group without touching
any core file.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from bridges.errors import ConfigError

BUILTIN_BACKENDS: dict[str, str] = {
    "grpo": "bridges.grpo.trainer:run",
    "trl": "bridges.adapters.trl.backend:run",
    "verl": "bridges.adapters.verl.launch:run",
    "tinker": "bridges.adapters.tinker.backend:run",
}

ENTRY_POINT_GROUP = "rl_bridges.backends"


def available_backends() -> dict[str, str]:
    """Built-in backends plus those registered by installed packages (built-ins win on a clash)."""
    found = {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}
    return {**found, **BUILTIN_BACKENDS}


def resolve_backend(name: str) -> Callable[[Any], int | None]:
    backends = available_backends()
    if name not in backends:
        raise ConfigError(f"unknown backend '{name}'; available backends: {', '.join(sorted(backends))}.")
    module_name, _, attr = backends[name].partition(":")
    return getattr(importlib.import_module(module_name), attr or "run")
