"""The code imports only what pyproject declares, and every module imports with the base dependencies alone.

(1) Each third-party import in the source (module level or inside a function) belongs to a
distribution declared in ``dependencies``, or, under ``adapters/<backend>/``, to that backend's extra
(or something it brings). (2) In a subprocess where every installed distribution outside the base
dependencies' closure is made unimportable, every module of ``bridges`` imports, or refuses with
``MissingExtraError`` naming the extra of the adapter it belongs to.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import json
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
SOURCES = ["bridges", "adapters", "workflows", "environments"]
EXTRA_FOLDERS = {f"adapters/{name}": name for name in ("trl", "verl", "tinker", "verifiers", "vllm")}
# bundled environments written for a framework: each needs that framework's extra, and says so
EXTRA_ENVIRONMENTS = {"repeat_letter_taskset": "verifiers"}
EXTRA_FOLDERS |= {f"environments/{name}.py": extra for name, extra in EXTRA_ENVIRONMENTS.items()}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(spec: str) -> str:
    return canonical(re.split(r"[\s<>=!~;\[]", spec, maxsplit=1)[0])


def closure(names: set[str]) -> set[str]:
    """``names`` and every installed distribution they require (markers with extras are skipped)."""
    from packaging.requirements import Requirement

    seen, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        for spec in requires:
            req = Requirement(spec)
            if req.marker is None or (req.marker.evaluate({"extra": ""}) and "extra" not in str(req.marker)):
                todo.append(canonical(req.name))
    return seen


BASE = {requirement_name(s) for s in PROJECT["dependencies"]}
EXTRAS = {
    extra: {requirement_name(s) for s in specs} for extra, specs in PROJECT["optional-dependencies"].items()
}


def third_party_imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n not in ("bridges", "__future__")}


def test_every_third_party_import_is_declared():
    providers = md.packages_distributions()
    undeclared = []
    for folder in SOURCES:
        for path in sorted((REPO / folder).rglob("*.py")):
            relative = str(path.relative_to(REPO))
            extra = next(
                (e for f, e in EXTRA_FOLDERS.items() if relative.startswith(f + "/") or relative == f), None
            )
            allowed = BASE | (closure(EXTRAS[extra]) if extra else set())
            for name in third_party_imports(path):
                dists = {canonical(d) for d in providers.get(name, [name])}
                if not dists & allowed:
                    undeclared.append(f"{relative} imports '{name}' ({', '.join(sorted(dists))})")
    assert not undeclared, "\n".join(undeclared)


BLOCKER = """
import importlib.abc, importlib.metadata as md, json, pkgutil, sys, traceback
allowed, stdlib = set(json.loads(sys.argv[1])), sys.stdlib_module_names
canonical = lambda n: n.replace("_", "-").replace(".", "-").lower()
blocked = set()
for name, dists in md.packages_distributions().items():
    if name not in stdlib and not {canonical(d) for d in dists} & allowed:
        blocked.add(name)

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named '{fullname}' (blocked: not a base dependency)", name=fullname)
        return None

sys.meta_path.insert(0, Block())
import importlib
from bridges.runtime.errors import MissingExtraError
results = {}
# the mapped packages (bridges.adapters -> adapters/ ...) are not folders under bridges/: walk each
for root in ("bridges", "bridges.adapters", "bridges.workflows", "bridges.environments"):
    package = importlib.import_module(root)
    for info in pkgutil.walk_packages(package.__path__, root + ".", onerror=lambda name: None):
        try:
            __import__(info.name)
            results[info.name] = "ok"
        except MissingExtraError as exc:
            results[info.name] = "extra: " + str(exc)
        except BaseException as exc:
            results[info.name] = "FAILED: " + "".join(traceback.format_exception_only(exc)).strip()
print(json.dumps(results))
"""


def test_every_module_imports_with_only_the_base_dependencies():
    allowed = sorted(closure(BASE) | {"rl-bridges"})
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(BLOCKER), json.dumps(allowed)],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(results) > 60 and "bridges.adapters.tinker.server" in results
    failed = {name: outcome for name, outcome in results.items() if outcome.startswith("FAILED")}
    assert not failed, json.dumps(failed, indent=1)
    for name, outcome in results.items():
        if outcome.startswith(
            "extra"
        ):  # only an adapter (or a framework's environment) needs its extra, named
            if name.startswith("bridges.environments."):
                assert f"rl-bridges[{EXTRA_ENVIRONMENTS[name.split('.')[2]]}]" in outcome, (name, outcome)
                continue
            backend = name.split(".")[2]
            assert name.startswith("bridges.adapters.") and f"rl-bridges[{backend}]" in outcome, (
                name,
                outcome,
            )
