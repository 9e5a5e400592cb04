"""The user guide holds: a short README without history, every relative link resolving (anchors too),
a configuration reference that is what the schemas say, the guide's multi-turn example being the tested
file, the README's and the guide's commands running (dry where they would train), the guide's Python
blocks running, and the site (mkdocs.yml, API reference included) building with no warning.

``BRIDGES_WRITE_DOCS=1 python -m pytest tests/test_docs.py`` rewrites ``docs/configuration.md``.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
COMMANDS = {  # command -> its options, as ``help`` prints them
    "bridges.train": "bridges.jobs.train:train_schema", "bridges.eval": "bridges.jobs.evaluate:EvalConfig",
    "bridges.compare": "bridges.jobs.compare:CompareConfig", "bridges.serve": "bridges.server.run:ServeConfig",
    "bridges.export": "bridges.jobs.export:ExportConfig", "bridges.sft": "bridges.jobs.sft:SFTRunConfig",
    "bridges.rescore": "bridges.jobs.rescore:RescoreConfig", "bridges.check": "bridges.jobs.check:CheckConfig",
}


def slug(heading: str) -> str:
    """The anchor a Markdown renderer (GitHub's rule) gives a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {slug(m) for m in re.findall(r"^#+ (.+)$", text, flags=re.M)}


HISTORY = re.compile(r"\bissues? \d+|\bcommit [0-9a-f]{7}|\bitem \d+ of|\bnot (done|explained) yet", flags=re.I)


def test_the_readme_is_short_and_tells_no_history():
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    assert not HISTORY.search(text)


@pytest.mark.parametrize("page", [p for p in PAGES if p != README], ids=lambda p: p.name)
def test_no_guide_page_tells_development_history(page: Path):
    """What the code does today; how it came to be is the CHANGELOG's (dated figures stay, with their
    machine and command, on the benchmarks page)."""
    found = HISTORY.search(page.read_text())
    assert found is None, f"{page.relative_to(ROOT)}: {found.group(0) if found else ''}"


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_resolves_inside_the_repository(page: Path):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for target in LINK.findall(text):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{page.relative_to(ROOT)} links to {target}, which does not exist"
        assert dest == ROOT or ROOT in dest.parents, f"{page.relative_to(ROOT)} links outside the repository"
        if anchor and dest.suffix == ".md":
            assert anchor in anchors(dest), f"{page.relative_to(ROOT)} links to #{anchor}, not a heading of {path}"


def render_configuration() -> str:
    from bridges.runs.config import help_text

    parts = ["# Configuration reference\n\n",
             "Every key of every command, generated from the schemas the commands parse "
             "(`tests/test_docs.py` keeps this page current). Each command prints the same with `help` or "
             "`help=<section>`; `bridges.train help=tinker` (or `trl`, `verl`) prints a backend's section.\n"]
    for command, target in COMMANDS.items():
        module, _, attr = target.partition(":")
        schema = getattr(importlib.import_module(module), attr)
        schema = schema() if callable(schema) and not isinstance(schema, type) else schema
        parts.append(f"\n## python -m {command}\n\n```text\n{help_text(schema).rstrip()}\n```\n")
    from bridges.adapters.tinker.backend import BACKEND as TINKER

    parts.append(f"\n## python -m bridges.train help=tinker\n\n```text\n{TINKER.section_help().rstrip()}\n```\n")
    return "".join(parts)


def test_the_configuration_reference_is_what_the_schemas_say():
    page = ROOT / "docs" / "configuration.md"
    expected = render_configuration()
    if os.environ.get("BRIDGES_WRITE_DOCS") == "1":
        page.write_text(expected)
    assert page.read_text() == expected, "docs/configuration.md is stale: rerun with BRIDGES_WRITE_DOCS=1"


def test_the_backends_table_is_what_each_backend_does(tmp_path: Path):
    """docs/guide/backends.md shows the record dry_run prints from (bridges/runs/training_signal.py)."""
    from bridges.runs.training_signal import ASPECTS, SAME_AS_GRPO, describe_signal, signal_table

    page = (ROOT / "docs" / "guide" / "backends.md").read_text()
    shown = page.split("<!-- training signal: rendered from bridges/runs/training_signal.py -->\n")[1]
    assert shown.split("<!-- end of training signal -->")[0] == signal_table()
    said = describe_signal("verl")
    assert said.count("\n") == len(ASPECTS) + 1 and "algorithm.adv_estimator=bridges_grpo" in said
    assert f": {SAME_AS_GRPO}\n" not in describe_signal("tinker")  # grpo's meaning, spelled out


def test_the_guides_multi_turn_example_is_the_tested_file():
    guide = (ROOT / "docs" / "guide" / "environments.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", guide, flags=re.S)
    assert (ROOT / "examples" / "countdown_env.py").read_text() in blocks
    assert len((ROOT / "examples" / "countdown_env.py").read_text().splitlines()) <= 30


def readme_commands() -> list[str]:
    """The ``python -m bridges.*`` lines of the README's bash blocks after the two first (continuations
    joined, comments dropped), less those marked ``# needs …`` (the Hub, a key, your own module)."""
    blocks = re.findall(r"```bash\n(.*?)\n```", README.read_text(), flags=re.S)[2:]
    picked = []
    for line in (b for block in blocks for b in block.replace("\\\n", " ").splitlines()):
        if line.startswith("python -m bridges.") and "# needs" not in line:
            picked.append(line.split("#")[0].strip())
    return picked


@pytest.mark.slow
def test_the_readmes_commands_run_dry_where_they_would_train(tmp_path: Path):
    """Run from a folder holding the README's ``my_env.py``: train and compare as dry runs, eval small."""
    source = re.search(r"```python\n(# my_env.py\n.*?)```", README.read_text(), flags=re.S)
    assert source is not None
    (tmp_path / "my_env.py").write_text(source.group(1))
    commands = readme_commands()
    assert len(commands) >= 6
    for command in commands:
        args = command.split()[2:]
        if args[0] in ("bridges.train", "bridges.compare"):
            args += ["dry_run=true"]
        elif args[0] == "bridges.eval":
            args += ["num_examples=2", "rollouts_per_example=1", "progress=false", f"output={tmp_path}/eval"]
        done = subprocess.run([sys.executable, "-m", *args], cwd=tmp_path, capture_output=True, text=True,
                              timeout=300, check=False)
        assert done.returncode == 0, f"{command}: {done.stderr[-1500:]}"


GUIDE = sorted((ROOT / "docs" / "guide").glob("*.md"))
DRY = {"bridges.train", "bridges.compare"}  # commands that would train: their dry run instead


def page_commands(page: Path) -> list[tuple[str, list[str]]]:
    """(folder, arguments) of each ``python -m bridges.*`` line of a page's bash blocks (continuations
    joined, comments dropped; ``cd <folder> &&`` kept as the folder), less those marked ``# needs …``."""
    picked = []
    for block in re.findall(r"```bash\n(.*?)\n```", page.read_text(), flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            folder, _, command = line.rpartition("&& ") if line.startswith("cd ") else ("", "", line)
            if command.startswith("python -m bridges.") and "# needs" not in command:
                picked.append((folder.removeprefix("cd ").strip(), command.split("#")[0].split()[2:]))
    return picked


@pytest.mark.slow
@pytest.mark.parametrize("page", [p for p in GUIDE if page_commands(p)], ids=lambda p: p.name)
def test_every_command_of_the_guide_runs_dry_where_it_would_train(page: Path, tmp_path: Path):
    """From a folder holding the README's ``my_env.py`` and the repository's ``examples/``: training and
    comparing as dry runs, evaluations on 2 rows, the rest (``bridges.init``) as written. A command that
    needs what a test cannot give (the Hub, a GPU, a key, a run made before) says so with ``# needs``."""
    source = re.search(r"```python\n(# my_env.py\n.*?)```", README.read_text(), flags=re.S)
    assert source is not None
    if "env=my_env" in page.read_text():
        (tmp_path / "my_env.py").write_text(source.group(1))
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    for index, (folder, args) in enumerate(page_commands(page)):
        if args[0] in DRY:
            args = [*args, "dry_run=true"]
        elif args[0] == "bridges.eval":
            args = [*args, "num_examples=2", "rollouts_per_example=1", "progress=false", f"output={tmp_path}/eval{index}"]
        env = {**os.environ, "PYTHONPATH": str(tmp_path), "HF_HUB_OFFLINE": "1"}
        done = subprocess.run([sys.executable, "-m", *args], cwd=tmp_path / folder, capture_output=True, text=True,
                              timeout=300, check=False, env=env)
        assert done.returncode == 0, f"{page.name}: {' '.join(args)}: {done.stderr[-1500:]}"


def python_blocks() -> list[tuple[str, str]]:
    return [(f"{page.name}[{i}]", block) for page in [README, *GUIDE]
            for i, block in enumerate(re.findall(r"```python\n(.*?)\n```", page.read_text(), flags=re.S))]


@pytest.mark.parametrize("name,block", python_blocks(), ids=[name for name, _ in python_blocks()])
def test_every_python_block_of_the_guide_compiles_and_the_complete_ones_run(name: str, block: str):
    """A block with ``...`` placeholders is a sketch (its full version is an example or a test the page
    names) and must at least compile; every other block runs as written, top-level ``await`` included,
    and an environment it defines builds and passes the checks a run starts with."""
    import ast
    import asyncio
    import inspect

    from bridges.runs.preflight import check_dataset

    code = compile(block, name, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    if "..." in block:
        return
    namespace: dict = {"__name__": "guide_block"}
    result = eval(code, namespace)  # noqa: S307 - the guide's own code, as a reader would run it
    if inspect.iscoroutine(result):
        asyncio.run(result)
    if "load_environment" in namespace:
        check_dataset(namespace["load_environment"](), "train", name)
    assert namespace.keys() - {"__name__", "__builtins__"}, f"{name} defined nothing"


@pytest.mark.slow
def test_the_docs_site_builds_with_no_warning(tmp_path: Path):
    """``mkdocs build --strict`` (mkdocs.yml): any broken link or anchor, page left out of the navigation
    or docstring the API reference cannot read fails the build; the reference renders the public API."""
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0 and "WARNING" not in done.stderr, done.stderr[-3000:]
    reference = (site / "api" / "environments" / "index.html").read_text()
    assert "SingleTurnEnv" in reference and "env_response" in reference  # docstrings, not just names
    assert not (site / "hooks.py").exists()


@pytest.mark.slow
def test_the_readmes_environment_learns_with_the_readmes_command_at_fewer_steps(tmp_path: Path):
    """The README's ``my_env.py`` and its train command, 40 of its 300 steps: each rubric function is in
    metrics.jsonl, partial credit rises and the exact answer starts to (docs: 0 -> ~0.98 in 300 steps)."""
    source = re.search(r"```python\n(# my_env.py\n.*?)```", README.read_text(), flags=re.S)
    assert source is not None
    (tmp_path / "my_env.py").write_text(source.group(1))
    command = next(c for c in readme_commands() if c.startswith("python -m bridges.train env=my_env"))
    args = [a if not a.startswith("trainer.max_steps=") else "trainer.max_steps=40" for a in command.split()[2:]]
    done = subprocess.run([sys.executable, "-m", *args, "progress=false"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-1500:]
    rows = [json.loads(x) for x in (tmp_path / "runs" / "grpo-my_env" / "metrics.jsonl").read_text().splitlines()]
    partial = [r["reward/a_number/mean"] for r in rows]
    exact = [r["reward/correct/mean"] for r in rows]
    assert sum(partial[-5:]) / 5 > sum(partial[:5]) / 5 + 0.3, partial
    assert exact[0] == 0.0 and max(exact) > 0.0, exact
    assert "  correct: " in done.stdout and "  a_number: " in done.stdout
