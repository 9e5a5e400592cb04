"""``python -m bridges.init``: the scaffold passes its own test as generated, and installed it loads by name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bridges.init import main
from bridges.runs.config import run_cli


@pytest.mark.slow
def test_scaffold_passes_its_own_test_and_loads_by_name_once_installed(tmp_path: Path):
    assert main(["my-words"]) == 0
    folder = Path("my-words").resolve()
    assert sorted(p.name for p in folder.iterdir()) == [
        "README.md",
        "my_words.py",
        "pyproject.toml",
        "test_my_words.py",
    ]
    env = {**os.environ, "BRIDGES_CACHE_DIR": os.environ["BRIDGES_CACHE_DIR"]}
    tested = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=folder,
                            capture_output=True, text=True, timeout=300, env=env)
    assert tested.returncode == 0 and "2 passed" in tested.stdout, tested.stdout[-2000:]
    # a real pip install (into a target folder, not this environment), then env=<name> from elsewhere
    site = tmp_path / "site"
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                                "--target", str(site), str(folder)], capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr[-2000:]
    entry = (site / "my_words-0.1.0.dist-info" / "entry_points.txt").read_text()
    assert "[rl_bridges.environments]" in entry and "my-words = my_words:load_environment" in entry
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "out"
    evaluated = subprocess.run(
        [sys.executable, "-m", "bridges.eval", "env=my-words", "model=tiny", "num_examples=2", "progress=false",
         f"output={out}"], cwd=elsewhere, capture_output=True, text=True, timeout=300,
        env={**env, "PYTHONPATH": str(site)},
    )
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    assert len((out / "results.jsonl").read_text().splitlines()) == 2
    assert json.loads((out / "metadata.json").read_text())["env"] == "my-words"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("Bad Name", "'Bad Name' is not a valid environment name"),
        ("../up", "'../up' is not a valid environment name"),
        ("json", "'json' is already taken by an importable module or a bundled environment"),
        ("reverse_text", "'reverse_text' is already taken"),
    ],
)
def test_bad_names_are_one_sentence(capsys, name: str, message: str):
    with pytest.raises(SystemExit) as exit_info:
        run_cli(main, [name])
    assert exit_info.value.code == 2 and capsys.readouterr().err.startswith(f"error: {message}")
    assert list(Path.cwd().iterdir()) == []


def test_an_existing_folder_is_refused(capsys):
    Path("taken").mkdir()
    with pytest.raises(SystemExit) as exit_info:
        run_cli(main, ["taken"])
    assert exit_info.value.code == 2 and "already exists" in capsys.readouterr().err
