"""Shape rules a reviewer would otherwise enforce by hand: no function over 60 lines and no module
over 600 in the library (core, environments, workflows, adapters, the trainer and the CLIs)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FOLDERS = ("bridges", "environments", "workflows", "adapters")
MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 600


def sources() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (REPO / folder).rglob("*.py"))


def test_no_function_is_longer_than_60_lines():
    long = []
    for path in sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({length} lines)")
    assert len(sources()) > 80
    assert not long, "\n".join(long)


def test_no_module_is_longer_than_600_lines():
    long = [
        f"{p.relative_to(REPO)} ({n} lines)"
        for p in sources()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert not long, "\n".join(long)
