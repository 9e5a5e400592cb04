"""The folders of ``bridges`` form layers that only point down, and nothing imports itself back.

From the bottom up (each may import only what is below it, never beside it in the top two rows):

    runtime                      errors, deadlines, bounded user code, processes, HTTP thread
    envs                         the environment API: records, messages, parsers, rubrics, envs, registry
    models                       placement and loading, the tiny and family models, chunked logprobs
    client                       any engine as an openai.AsyncOpenAI, with the token ledger
    runs                         config, the backend/engine seam tables, preflight, metrics
    bridges (the public face)    lazy re-exports for ``import bridges as br``
    bridges.environments         bundled environments
    bridges.workflows            environment state -> token-exact episodes
    bridges.adapters             one folder per backend or engine
    grpo | server | jobs         applications: the bundled trainer, the HTTP server, the other commands' work
    train, eval, serve, ...      the commands at the root: argument handling and one call

Every ``import`` counts, module level or inside a function (a function-level import is still a
dependency; it only moves the failure to run time). Backends and engines are reached from below
only through declared dotted-path tables (``bridges.runs.backends``, ``bridges.runs.engines``),
which are data, not imports.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FOLDERS = {"bridges": "bridges", "environments": "bridges.environments", "workflows": "bridges.workflows",
           "adapters": "bridges.adapters"}
# (layer name, the packages in it); within the two top layers, no package imports another
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("runtime", ("bridges.runtime",)),
    ("envs", ("bridges.envs",)),
    ("models", ("bridges.models",)),
    ("client", ("bridges.client",)),
    ("agents", ("bridges.agents",)),
    ("runs", ("bridges.runs",)),
    ("public face", ("bridges",)),
    ("environments", ("bridges.environments",)),
    ("workflows", ("bridges.workflows",)),
    ("adapters", ("bridges.adapters",)),
    ("applications", ("bridges.grpo", "bridges.server", "bridges.jobs")),
    ("commands", ()),  # every other module at the root of bridges/
]
SIDE_BY_SIDE = ("applications", "commands")
COMMANDS = {"train", "eval", "serve", "compare", "check", "sft", "rescore", "export", "init"}


def place(module: str) -> tuple[int, str]:
    """(layer index, the package or command it belongs to)."""
    best: tuple[int, str] | None = None
    for rank, (_, packages) in enumerate(LAYERS):
        for package in packages:
            inside = module == package or module.startswith(package + ".")
            if inside and package != "bridges" and (best is None or len(package) > len(best[1])):
                best = (rank, package)
    if best is not None:
        return best
    if module == "bridges":
        return 5, "bridges"
    return len(LAYERS) - 1, module


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


def against_the_layers(source: str, target: str) -> bool:
    (source_rank, source_home), (target_rank, target_home) = place(source), place(target)
    if target_rank != source_rank:
        return target_rank > source_rank
    return LAYERS[source_rank][0] in SIDE_BY_SIDE and source_home != target_home


def test_layers_only_point_down():
    graph = import_graph()
    assert len(graph) > 100
    wrong = [
        f"{source} ({LAYERS[place(source)[0]][0]}) imports {target} ({LAYERS[place(target)[0]][0]})"
        for source, targets in sorted(graph.items())
        for target in sorted(targets)
        if against_the_layers(source, target)
    ]
    assert not wrong, "\n".join(wrong)


def test_the_layer_rule_catches_an_import_against_it():
    """The rule itself, on imports that must be refused: up a layer, and sideways at the top."""
    assert against_the_layers("bridges.runtime.errors", "bridges.envs.types")
    assert against_the_layers("bridges.client.ledger", "bridges.runs.config")
    assert against_the_layers("bridges.runs.preflight", "bridges.adapters.hf.engine")
    assert against_the_layers("bridges.jobs.evaluate", "bridges.grpo.trainer")
    assert against_the_layers("bridges.train", "bridges.check")
    assert not against_the_layers("bridges.grpo.trainer", "bridges.adapters.hf.engine")
    assert not against_the_layers("bridges.train", "bridges.jobs.train")
    assert not against_the_layers("bridges.environments.reverse_text", "bridges")


def test_the_root_holds_the_public_face_the_commands_and_the_folders():
    """``ls bridges/`` is the map: folders by role, and commands that parse arguments and call one
    function in a folder (no classes, no helpers of their own)."""
    root = REPO / "bridges"
    files = {p.stem for p in root.glob("*.py")}
    assert files == COMMANDS | {"__init__"}
    folders = {p.name for p in root.iterdir() if p.is_dir() and p.name != "__pycache__"}
    installed = {"adapters", "workflows", "environments"}  # repository-root folders, mapped into bridges.*
    layered = {package.split(".")[1] for _, packages in LAYERS for package in packages if "." in package}
    assert folders == layered - installed
    for command in COMMANDS:
        tree = ast.parse((root / f"{command}.py").read_text())
        defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))}
        assert defined <= {"main", "cli"}, (command, defined)
    for folder in folders:
        docstring = ast.get_docstring(ast.parse((root / folder / "__init__.py").read_text())) or ""
        assert "May import" in docstring and "Must not" in docstring, folder


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
