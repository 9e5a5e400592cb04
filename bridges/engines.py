"""The engines, by name: one table that train, eval, serve and compare all read.

Names map to dotted paths, so no engine library is imported until that engine is chosen; a missing
extra is one sentence. Every engine class satisfies ``bridges.types.Engine`` and offers
``from_pretrained(model, **options)``; the trainable ones (hf, vllm) also ``bridges.types.TrainableEngine``.
"""

from __future__ import annotations

import importlib
from typing import Any

from bridges.errors import ConfigError, MissingExtraError

ENGINES: dict[str, tuple[str, str]] = {  # name -> (dotted path, the extra that installs it)
    "hf": ("bridges.adapters.hf:HFEngine", "base"),
    "vllm": ("bridges.adapters.vllm:VLLMEngine", "vllm"),
}


def engine_class(name: str) -> Any:
    """The class registered as ``name``."""
    if name not in ENGINES:
        raise ConfigError(f"unknown engine '{name}'; engines: {', '.join(ENGINES)}.")
    target, extra = ENGINES[name]
    module_name, _, attr = target.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except ImportError as exc:
        raise MissingExtraError(
            f"engine '{name}' is not available here ({exc}); install it with pip install 'rl-bridges[{extra}]'."
        ) from exc


def load_engine(name: str, model: str, **options: Any) -> Any:
    """``engine_class(name).from_pretrained(model, **options)``: an engine over a checkpoint ('tiny', a
    folder or a hub id)."""
    return engine_class(name).from_pretrained(model, **options)
