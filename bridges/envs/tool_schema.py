"""OpenAI tool schemas from a plain Python function's signature and docstring.

Authors write ordinary typed functions; the schema the model sees is derived, never hand-written,
so it cannot drift from the code that runs. Google-style ``Args:`` sections and reST ``:param x:``
lines both give parameter descriptions; the summary before them gives the tool description.
"""

from __future__ import annotations

import enum
import inspect
import re
import types
import typing
from collections.abc import Callable
from typing import Any

from bridges.runtime.errors import ConfigError

_SIMPLE: dict[Any, str] = {int: "integer", float: "number", str: "string", bool: "boolean"}
_SECTION_RE = re.compile(
    r"^\s*(Args|Arguments|Parameters|Params|Returns|Return|Yields|Raises|Examples?|Notes?)\s*:\s*$"
)
_GOOGLE_PARAM_RE = re.compile(r"^\s*\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_REST_PARAM_RE = re.compile(r"^\s*:param\s+(?:[^:]*\s)?(\w+)\s*:\s*(.*)$")


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Return (description, {param: description})."""
    lines = inspect.cleandoc(doc).splitlines() if doc else []
    summary: list[str] = []
    params: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    indent = 0
    for line in lines:
        heading = _SECTION_RE.match(line)
        if heading:
            section, current = heading.group(1).lower(), None
            continue
        rest = _REST_PARAM_RE.match(line)
        if rest:
            section, current = "rest", rest.group(1)
            params[current] = rest.group(2).strip()
            continue
        if line.strip().startswith(":"):  # :returns:, :raises:, :type x: end a reST param
            section, current = "rest-other", None
            continue
        if section is None:
            summary.append(line)
        elif section in ("args", "arguments", "parameters", "params"):
            width = len(line) - len(line.lstrip())
            match = _GOOGLE_PARAM_RE.match(line)
            if match and (current is None or width <= indent):
                current, indent = match.group(1), width
                params[current] = match.group(2).strip()
            elif current is not None and line.strip():
                params[current] = f"{params[current]} {line.strip()}".strip()
        elif section == "rest" and current is not None and line.strip():
            params[current] = f"{params[current]} {line.strip()}".strip()
    description = " ".join(" ".join(summary).split())
    return description, params


def _is_optional(tp: Any) -> tuple[bool, Any]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) < len(typing.get_args(tp)):
            inner = args[0] if len(args) == 1 else typing.Union[tuple(args)]  # noqa: UP007
            return True, inner
    return False, tp


def type_to_schema(tp: Any) -> dict[str, Any]:
    """JSON schema for a Python annotation (unknown or missing annotations allow any value)."""
    if tp is inspect.Parameter.empty or tp is Any:
        return {}
    optional, inner = _is_optional(tp)
    if optional:
        schema = type_to_schema(inner)
        if isinstance(schema.get("type"), str):
            return {**schema, "type": [schema["type"], "null"]}
        return {"anyOf": [schema, {"type": "null"}]}
    if tp in _SIMPLE:
        return {"type": _SIMPLE[tp]}
    if tp is type(None):
        return {"type": "null"}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        values = [m.value for m in tp]
        schema = type_to_schema(type(values[0])) if values else {}
        return {**schema, "enum": values}
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        schema = type_to_schema(type(args[0])) if args and all(type(a) is type(args[0]) for a in args) else {}
        return {**schema, "enum": list(args)}
    if origin in (typing.Union, types.UnionType):
        return {"anyOf": [type_to_schema(a) for a in args]}
    if tp in (list, tuple, set, frozenset) or origin in (list, tuple, set, frozenset):
        schema = {"type": "array"}
        if args and not (origin is tuple and len(args) == 2 and args[1] is Ellipsis):
            if origin is tuple:
                schema["prefixItems"] = [type_to_schema(a) for a in args]
            else:
                schema["items"] = type_to_schema(args[0])
        elif args:
            schema["items"] = type_to_schema(args[0])
        return schema
    if tp is dict or origin is dict:
        schema = {"type": "object"}
        if len(args) == 2 and args[1] is not Any:
            schema["additionalProperties"] = type_to_schema(args[1])
        return schema
    return {}


def tool_schema(func: Callable[..., Any]) -> dict[str, Any]:
    """``{"type": "function", "function": {name, description, parameters}}`` for ``func``.

    ``required`` lists the parameters without defaults; extra arguments are refused
    (``additionalProperties: false``) so a model's typo comes back as an error, not a silent drop.
    """
    name = getattr(func, "__name__", None)
    if not name or name == "<lambda>":
        raise ConfigError("a tool must be a named function (a lambda has no name the model could call).")
    try:
        hints = typing.get_type_hints(func, include_extras=False)
    except Exception:  # unresolvable forward references: fall back to the raw annotations
        hints = getattr(func, "__annotations__", {})
    description, param_docs = _parse_docstring(inspect.getdoc(func) or "")
    properties: dict[str, Any] = {}
    required: list[str] = []
    for param in inspect.signature(func).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD) or param.name in ("self", "cls"):
            continue
        schema = type_to_schema(hints.get(param.name, param.annotation))
        if param.name in param_docs and param_docs[param.name]:
            schema = {**schema, "description": param_docs[param.name]}
        properties[param.name] = schema
        if param.default is param.empty:
            required.append(param.name)
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": False,
            },
        },
    }
