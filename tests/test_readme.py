"""The README's two first commands are the project's promise; CI must run exactly them, in order."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _readme_commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)\n```", (ROOT / "README.md").read_text(), flags=re.S)
    return [b.strip() for b in blocks[:2]]


def test_ci_runs_the_readme_commands_exactly_and_in_order():
    """The main job first, then the tests, in the same checkout: a suite that passes alone but fails
    beside the main job's run folder cannot pass CI."""
    setup_and_main, tests = _readme_commands()
    ci_lines = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()]
    commands = [ln for ln in ci_lines if ln and not ln.startswith(("#", "set ", "cd ", "export "))]
    assert commands == [setup_and_main, tests]
    assert "pytest" in tests and "torch==2.13.0" in tests
    assert tests.index("ruff check") < tests.index(".ci/typecheck") < tests.index("pytest")


def test_readme_main_job_installs_cpu_torch_first_and_runs_a_bridges_module():
    setup_and_main, _ = _readme_commands()
    assert setup_and_main.index("torch==2.13.0") < setup_and_main.index("pip install -e")
    assert "python -m bridges." in setup_and_main
