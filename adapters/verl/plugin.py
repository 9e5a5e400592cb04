"""Imported by verl itself in every one of its processes (``VERL_USE_EXTERNAL_MODULES``, set by the
launcher): registers the ``hf`` rollout, works around verl 0.9.1's trl import, and on a CPU
(``BRIDGES_VERL_CPU=1``) selects the CPU platform. verl's installed files are never touched.

The trl workaround: verl's model patching imports ``AutoModelForCausalLMWithValueHead`` whenever
``is_trl_available()``, and trl 1.x no longer has that class, so any process with both installed
(our own ``[dev]`` set) crashes, on a GPU as well. Only value-head (critic) models use the class, so
verl is told trl is available exactly when trl still provides it.
"""

from __future__ import annotations

import importlib
import importlib.util
import os

from bridges.errors import require_extra

CPU_FLAG = "BRIDGES_VERL_CPU"


def trl_has_value_head() -> bool:
    """verl's ``is_trl_available``, answered as verl means it (checked only when verl asks)."""
    if importlib.util.find_spec("trl") is None:
        return False
    return hasattr(importlib.import_module("trl"), "AutoModelForCausalLMWithValueHead")


def _fix_trl_probe() -> None:
    import_utils = require_extra("verl.utils.import_utils", "verl", "backend=verl")
    setattr(import_utils, "is_trl_available", trl_has_value_head)  # noqa: B010 (a patch, on purpose)


def install() -> None:
    _fix_trl_probe()
    if os.environ.get(CPU_FLAG) == "1":
        from bridges.adapters.verl import cpu_platform

        cpu_platform.enable()
    import bridges.adapters.verl.hf_rollout  # noqa: F401 (registers rollout.name=hf on import)


install()
