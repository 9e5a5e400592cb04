"""Record the part of vLLM's API our engine touches, from a release's wheel, without installing it.

    python tests/support/record_vllm_api.py vllm-0.26.0-*.whl vllm-0.33.0-*.whl > tests/support/vllm_api.json

vLLM needs a GPU, so CI cannot import it; the seam's contract test (``tests/adapters/test_vllm_releases.py``)
instead drives ``VLLMEngine`` through a stand-in built from this record: the signatures of the
``AsyncLLM`` methods we call, the fields of ``SamplingParams`` and ``AsyncEngineArgs``, the members of
``RequestOutputKind`` and the pause modes. Read from the source with ``ast``: nothing in the wheel runs.
"""

from __future__ import annotations

import ast
import json
import re
import sys
import zipfile
from typing import Any

METHODS = ("generate", "pause_generation", "resume_generation", "is_paused", "reset_prefix_cache", "collective_rpc",
           "sleep", "wake_up", "is_sleeping", "abort", "add_lora", "shutdown")
# how a request made during pause_generation(mode="wait") is treated, from the method's docstring
PAUSED_REQUESTS = {"queued": "will not be scheduled until resume", "refused": "rejected with"}


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    return next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)


def _fields(node: ast.ClassDef) -> list[str]:
    return [n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]


def _signature(func: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, Any]:
    a = func.args
    positional = [p.arg for p in a.posonlyargs + a.args][1:]  # without self
    defaults = dict(zip(positional[len(positional) - len(a.defaults):], map(ast.unparse, a.defaults), strict=True))
    keyword = {p.arg: (ast.unparse(d) if d is not None else None) for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)}
    return {"async": isinstance(func, ast.AsyncFunctionDef), "positional": positional, "defaults": defaults,
            "keyword_only": keyword, "returns": ast.unparse(func.returns) if func.returns else None}


def record(wheel: str) -> tuple[str, dict[str, Any]]:
    with zipfile.ZipFile(wheel) as archive:
        def source(path: str) -> ast.Module:
            return ast.parse(archive.read(path).decode())

        version = re.search(r"vllm-([\d.]+)-", wheel).group(1)  # type: ignore[union-attr]
        async_llm = _class(source("vllm/v1/engine/async_llm.py"), "AsyncLLM")
        methods = {n.name: n for n in async_llm.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
        sampling = source("vllm/sampling_params.py")
        args = source("vllm/engine/arg_utils.py")
        engine_init = source("vllm/v1/engine/__init__.py")
    pause_doc = " ".join((ast.get_docstring(methods["pause_generation"]) or "").split())
    pause_mode = next(n for n in engine_init.body if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "PauseMode")
    kinds = _class(sampling, "RequestOutputKind")
    return version, {
        "async_llm": {name: _signature(methods[name]) for name in METHODS},
        "requests_made_while_paused": next(k for k, phrase in PAUSED_REQUESTS.items() if phrase in pause_doc),
        "pause_modes": [e.value for e in ast.walk(pause_mode.value) if isinstance(e, ast.Constant)],
        "request_output_kinds": [t.targets[0].id for t in kinds.body if isinstance(t, ast.Assign)],  # type: ignore[attr-defined]
        "sampling_params": _fields(_class(sampling, "SamplingParams")),
        "engine_args": sorted(set(_fields(_class(args, "EngineArgs"))) | set(_fields(_class(args, "AsyncEngineArgs")))),
    }


if __name__ == "__main__":
    print(json.dumps(dict(record(w) for w in sys.argv[1:]), indent=1, sort_keys=True))
