"""The distribution installs exactly one import package, ``bridges`` (the repository's adapters/,
workflows/ and environments/ folders become bridges.adapters, bridges.workflows, bridges.environments)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FOLDERS = {"bridges": "bridges", "adapters": "bridges.adapters", "workflows": "bridges.workflows",
           "environments": "bridges.environments"}


def declared_packages() -> list[str]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]


def test_the_package_list_is_every_folder_with_an_init():
    """pyproject lists packages by hand (package-dir maps folders into bridges.*): none may be missing."""
    found = set()
    for folder, name in FOLDERS.items():
        for init in (REPO / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(REPO / folder)
            found.add(".".join([name, *relative.parts]))
    assert sorted(declared_packages()) == sorted(found)


def test_the_wheel_has_one_top_level_package(tmp_path: Path):
    source = tmp_path / "src"  # a copy: setuptools writes build/ next to the sources it builds
    anywhere = shutil.ignore_patterns(".git", "build", "*.egg-info", "__pycache__")
    at_the_root = {".venv", "runs", "outputs", "tests"}  # run folders a user made; bridges/runs/ is code

    def skip(folder: str, names: list[str]) -> set[str]:
        return set(anywhere(folder, names)) | ({n for n in names if n in at_the_root} if Path(folder) == REPO else set())

    shutil.copytree(REPO, source, ignore=skip)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(source)],
        check=True, capture_output=True, timeout=300,
    )
    (wheel,) = tmp_path.glob("rl_bridges-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"bridges"}
    for module in ("bridges/adapters/tinker/server.py", "bridges/workflows/rollouts.py",
                   "bridges/environments/repeat_letter.py", "bridges/grpo/trainer.py", "bridges/runs/config.py",
                   "bridges/models/chat-templates/qwen2.5.jinja"):
        assert module in names
