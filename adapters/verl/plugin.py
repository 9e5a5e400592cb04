"""Imported by verl itself in every one of its processes (``VERL_USE_EXTERNAL_MODULES``, set by the
launcher): registers the ``hf`` rollout and the ``bridges_grpo`` advantages, works around verl 0.9.1's trl
import, and on a CPU (``BRIDGES_VERL_CPU=1``) selects the CPU platform. verl's installed files are never touched.

The trl workaround: verl's model patching imports ``AutoModelForCausalLMWithValueHead`` whenever
``is_trl_available()``, and trl 1.x no longer has that class, so any process with both installed
(our own ``[dev]`` set) crashes, on a GPU as well. Only value-head (critic) models use the class, so
verl is told trl is available exactly when trl still provides it.

verl's agent loop resolves a "Continuous Token builder" from the model's ``model_type`` once per
trajectory, and for a type it has no builder for (Llama, our tiny models) warns each time: a warning
per rollout, thousands in a run. ``_once_per_process`` lets exactly that message through once in each
verl process; every other record of that logger, and every other warning, is untouched.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os

from bridges.adapters.verl.placement import CPU_FLAG
from bridges.runtime.errors import require_extra


def trl_has_value_head() -> bool:
    """verl's ``is_trl_available``, answered as verl means it (checked only when verl asks)."""
    if importlib.util.find_spec("trl") is None:
        return False
    return hasattr(importlib.import_module("trl"), "AutoModelForCausalLMWithValueHead")


def _fix_trl_probe() -> None:
    import_utils = require_extra("verl.utils.import_utils", "verl", "backend=verl")
    setattr(import_utils, "is_trl_available", trl_has_value_head)  # noqa: B010 (a patch, on purpose)


BUILDER_LOGGER = "verl.utils.tokenizer.continuous_token_wiring"
BUILDER_FALLBACK = "No model-specific Continuous Token builder is registered"


class _OncePerProcess(logging.Filter):
    """Passes the first record whose message starts with ``prefix``, drops the repeats, passes the rest."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix, self.seen = prefix, False

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(self.prefix):
            return True
        seen, self.seen = self.seen, True
        return not seen


def _once_per_process() -> None:
    builder_logger = logging.getLogger(BUILDER_LOGGER)
    if not any(isinstance(f, _OncePerProcess) for f in builder_logger.filters):
        builder_logger.addFilter(_OncePerProcess(BUILDER_FALLBACK))


MARKS_VARIABLE = "BRIDGES_VERL_MARKS"


def _mark_process() -> None:
    """With ``BRIDGES_VERL_MARKS=<folder>``: one file per verl process that loaded the plugin, named by its
    Ray node and pid, so a cluster's users (and our tests) can see the plugin reached every node."""
    folder = os.environ.get(MARKS_VARIABLE)
    if not folder:
        return
    node = "driver"
    try:
        import ray

        if ray.is_initialized():
            node = ray.get_runtime_context().get_node_id()
    except Exception:  # not a Ray process, or Ray without a context yet: the driver's mark
        pass
    from pathlib import Path

    Path(folder).mkdir(parents=True, exist_ok=True)
    (Path(folder) / f"{node}-{os.getpid()}").write_text(os.environ.get(CPU_FLAG, "0"))


def install() -> None:
    _mark_process()
    _fix_trl_probe()
    _once_per_process()
    if os.environ.get(CPU_FLAG) == "1":
        from bridges.adapters.verl import cpu_platform

        cpu_platform.enable()
    import bridges.adapters.verl.hf_rollout  # noqa: F401 (registers rollout.name=hf on import)
    from bridges.adapters.verl.advantages import register

    register()  # algorithm.adv_estimator=bridges_grpo: failed rollouts out of the group baseline


install()
