"""The engines, by name: one table that train, eval, serve and compare all read.

Names map to dotted paths, so no engine library is imported until that engine is chosen; a missing
extra is one sentence. Every engine class satisfies ``bridges.envs.types.Engine`` and offers
``from_pretrained(model, **options)``; the trainable ones (hf, paged, vllm) also ``bridges.envs.types.TrainableEngine``.
"""

from __future__ import annotations

import importlib
from typing import Any

from bridges.runtime.errors import ConfigError, MissingExtraError

ENGINES: dict[str, tuple[str, str]] = {  # name -> (dotted path, the extra that installs it)
    "hf": ("bridges.adapters.hf:HFEngine", "base"),
    "paged": ("bridges.adapters.hf:PagedEngine", "base"),
    "vllm": ("bridges.adapters.vllm:VLLMEngine", "vllm"),
}


def engine_class(name: str) -> Any:
    """The class registered as ``name``, or the class a ``module:Class`` path names (a user's own
    engine, for example a scripted teacher; it must offer ``from_pretrained(model, **options)``)."""
    if ":" in name:
        return _dotted_engine(name)
    if name not in ENGINES:
        raise ConfigError(f"unknown engine '{name}'; engines: {', '.join(ENGINES)}, or module:Class.")
    target, extra = ENGINES[name]
    module_name, _, attr = target.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except ImportError as exc:
        raise MissingExtraError(
            f"engine '{name}' is not available here ({exc}); install it with pip install 'rl-bridges[{extra}]'."
        ) from exc


def _dotted_engine(path: str) -> Any:
    module_name, _, attr = path.partition(":")
    try:
        found = getattr(importlib.import_module(module_name), attr, None)
    except ImportError as exc:
        raise ConfigError(f"engine '{path}': module '{module_name}' cannot be imported ({exc}).") from None
    if found is None or not callable(getattr(found, "from_pretrained", None)):
        raise ConfigError(
            f"engine '{path}' names no class with from_pretrained(model, **options) in '{module_name}'."
        )
    return found


def load_engine(name: str, model: str, **options: Any) -> Any:
    """``engine_class(name).from_pretrained(model, **options)``: an engine over a checkpoint ('tiny', a
    folder or a hub id)."""
    return engine_class(name).from_pretrained(model, **options)
