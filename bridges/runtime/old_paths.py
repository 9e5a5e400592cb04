"""Old import paths keep working: ``bridges.rubric`` is ``bridges.envs.rubric`` (issue 24's move).

Before the root of ``bridges/`` was grouped into folders, user code, configs (``module:attr`` dotted
paths) and pickles could name a module as ``bridges.<name>``. A meta-path finder answers those names
with the very module object at its new path, so ``isinstance`` checks, monkeypatches and module-level
state stay one thing, not two copies; importing an old path warns once (``DeprecationWarning``).
CHANGELOG.md lists every move.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

MOVED: dict[str, str] = {
    "bridges.errors": "bridges.runtime.errors",
    "bridges.deadlines": "bridges.runtime.deadlines",
    "bridges.usercode": "bridges.runtime.usercode",
    "bridges.asyncutils": "bridges.runtime.asyncutils",
    "bridges.gc_policy": "bridges.runtime.gc_policy",
    "bridges.launch": "bridges.runtime.launch",
    "bridges.http_server": "bridges.runtime.http_server",
    "bridges.state_files": "bridges.runtime.state_files",
    "bridges.types": "bridges.envs.types",
    "bridges.messages": "bridges.envs.messages",
    "bridges.parsers": "bridges.envs.parsers",
    "bridges.rubric": "bridges.envs.rubric",
    "bridges.judge": "bridges.envs.judge",
    "bridges.results": "bridges.envs.results",
    "bridges.registry": "bridges.envs.registry",
    "bridges.hardware": "bridges.models.hardware",
    "bridges.tiny": "bridges.models.tiny",
    "bridges.family_models": "bridges.models.family_models",
    "bridges.local_models": "bridges.models.local_models",
    "bridges.token_logprobs": "bridges.models.token_logprobs",
    "bridges.template_check": "bridges.client.template_check",
    "bridges.config": "bridges.runs.config",
    "bridges.train_config": "bridges.runs.train_config",
    "bridges.backends": "bridges.runs.backends",
    "bridges.engines": "bridges.runs.engines",
    "bridges.metrics": "bridges.runs.metrics",
    "bridges.preflight": "bridges.runs.preflight",
    "bridges.serve_schema": "bridges.server.schema",
    "bridges.compare_report": "bridges.jobs.compare_report",
    "bridges.fidelity": "bridges.jobs.fidelity",
}


class _Alias(importlib.abc.Loader):
    """Hands back the module already imported under its new name; executing it again would make two."""

    def __init__(self, new_name: str) -> None:
        self.new_name = new_name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self.new_name)

    def exec_module(self, module: ModuleType) -> None:
        return None


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Finds only the names in ``MOVED``; every other import goes on to the normal finders."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        new_name = MOVED.get(fullname)
        if new_name is None:
            return None
        warnings.warn(f"{fullname} moved to {new_name}; import it from there (CHANGELOG.md lists every move)",
                      DeprecationWarning, stacklevel=2)
        return importlib.machinery.ModuleSpec(fullname, _Alias(new_name))


def install() -> None:
    """Put the finder on ``sys.meta_path`` once per process."""
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedModuleFinder())
