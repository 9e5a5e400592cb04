"""Module paths from before the folders (issue 24) still import, as the same module object, with a
warning that names the new path; the changelog lists every one of them."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from bridges.runtime.old_paths import MOVED

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_is_the_new_module(old: str):
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {MOVED[old]}"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(MOVED[old])
    assert sys.modules[old] is module and module.__name__ == MOVED[old]


def test_old_from_imports_and_dotted_config_paths_resolve_to_the_same_objects():
    """What user code wrote before the move: ``from bridges.rubric import Rubric``, a ``module:attr``
    path in a config, a monkeypatch through the old module (one module object, so it takes effect)."""
    code = (
        "import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
        "import bridges\n"
        "from bridges.envs.rubric import Rubric as New\n"
        "try:\n    from bridges.rubric import Rubric\nexcept DeprecationWarning as w:\n    print('warned:', w)\n"
        "warnings.simplefilter('ignore')\n"
        "from bridges.rubric import Rubric\n"
        "import bridges.config as old_config, bridges.runs.config as new_config\n"
        "from bridges.runs.engines import engine_class\n"
        "old_config.MARK = 1\n"
        "print(Rubric is New, new_config.MARK, engine_class('bridges.adapters.hf.engine:HFEngine').__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "warned: bridges.rubric moved to bridges.envs.rubric; import it from there (CHANGELOG.md lists every move)"
    assert lines[1] == "True 1 HFEngine"


def test_an_unknown_old_path_is_still_an_import_error():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("bridges.no_such_module")


def test_the_changelog_lists_every_move():
    changelog = (REPO / "CHANGELOG.md").read_text()
    missing = [f"{old} -> {new}" for old, new in MOVED.items() if f"| `{old}` | `{new}` |" not in changelog]
    assert not missing, missing
