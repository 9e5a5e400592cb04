"""The suite's result does not depend on what ran before it in the same checkout.

The README's main job writes ``runs/grpo-repeat_letter`` where it is started, and a command refuses to
start over a run that is already there; so every test starts in an empty folder of its own
(``own_working_directory`` in ``tests/conftest.py``), and this file proves it holds.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# tests that start commands writing runs/ or outputs/ relative to where they run
COMMAND_TESTS = [
    "tests/faults/test_bad_config.py",
    "tests/grpo/test_train_cli.py::test_dry_run_prints_the_resolved_config_and_writes_nothing",
]


def test_every_test_starts_in_an_empty_folder_of_its_own():
    here = Path.cwd().resolve()
    assert here != REPO and REPO not in here.parents
    assert list(here.iterdir()) == []


def _command(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})


@pytest.mark.slow
def test_command_tests_pass_beside_a_finished_default_run_and_evaluation(tmp_path: Path):
    """The README's main job (shortened) and an evaluation leave ``runs/`` and ``outputs/`` in a folder;
    pytest started there runs the command-running tests, and they pass."""
    user_folder = tmp_path / "checkout"
    user_folder.mkdir()
    trained = _command(user_folder, "-m", "bridges.train", "trainer.max_steps=2", "progress=false")
    assert trained.returncode == 0, trained.stderr[-2000:]
    evaluated = _command(user_folder, "-m", "bridges.eval", "env=repeat_letter", "num_examples=2", "progress=false")
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    assert (user_folder / "runs" / "grpo-repeat_letter" / "metrics.jsonl").exists()
    assert (user_folder / "outputs" / "repeat_letter--tiny" / "results.jsonl").exists()

    selected = [str(REPO / test) for test in COMMAND_TESTS]
    suite = _command(user_folder, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(REPO),
                     "-c", str(REPO / "pyproject.toml"), *selected)
    assert suite.returncode == 0, suite.stdout[-3000:]
    assert " passed" in suite.stdout and " failed" not in suite.stdout
    assert sorted(p.name for p in user_folder.iterdir()) == ["outputs", "runs"]  # nothing else written there
