"""Layers only point down, and no module imports itself back through others.

core (``bridges`` types, envs, rubric, parsers, messages, client, registry, config, ...)
  <- ``bridges.environments`` <- ``bridges.workflows`` <- ``bridges.adapters``
  <- applications (the grpo trainer, the CLIs train / eval / compare / serve / rescore / check /
  init / export / sft, and the fidelity run).

Every ``import`` counts, module level or inside a function (a function-level import is still a
dependency; it only moves the failure to run time). Backends and engines are reached from the
core only through declared dotted-path tables (``bridges.backends``, ``bridges.registry``), which
are data, not imports.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FOLDERS = {"bridges": "bridges", "environments": "bridges.environments", "workflows": "bridges.workflows",
           "adapters": "bridges.adapters"}  # fmt: skip
APPLICATIONS = ("bridges.grpo", "bridges.train", "bridges.eval", "bridges.compare", "bridges.compare_report",
                "bridges.serve", "bridges.serve_schema", "bridges.rescore", "bridges.check",
                "bridges.fidelity", "bridges.init", "bridges.export", "bridges.sft")  # fmt: skip
LAYER_NAMES = ["core", "environments", "workflows", "adapters", "applications"]


def layer(module: str) -> int:
    if any(module == app or module.startswith(app + ".") for app in APPLICATIONS):
        return 4
    for rank, package in ((3, "bridges.adapters"), (2, "bridges.workflows"), (1, "bridges.environments")):
        if module == package or module.startswith(package + "."):
            return rank
    return 0


def modules() -> dict[str, Path]:
    found = {}
    for folder, package in FOLDERS.items():
        for path in (REPO / folder).rglob("*.py"):
            parts = list(path.relative_to(REPO / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([package, *parts])] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """module -> the modules of this project it imports (a name resolves to its longest known module)."""
    known = modules()

    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in known.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            targets.update(t for t in map(resolve, (n for n in names if n.startswith("bridges"))) if t)
        graph[module] = targets - {module}
    return graph


def test_layers_only_point_down():
    graph = import_graph()
    assert len(graph) > 80
    upward = [
        f"{source} ({LAYER_NAMES[layer(source)]}) imports {target} ({LAYER_NAMES[layer(target)]})"
        for source, targets in sorted(graph.items())
        for target in sorted(targets)
        if layer(target) > layer(source)
    ]
    assert not upward, "\n".join(upward)


def test_no_import_cycles():
    graph = import_graph()
    # a package imports its own submodules (bridges/__init__ re-exports); edges into a package's
    # __init__ from its submodules would be cycles and are counted like any other
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    assert not cycles, cycles
