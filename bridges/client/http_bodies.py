"""OpenAI-style JSON bodies <-> ``create`` keyword arguments, shared by ``bridges.serve`` (real HTTP)
and ``EngineClient``'s in-process transport (code that calls the SDK's generic ``client.post``).

A body's keys that the SDK's ``create`` knows become keyword arguments; the rest are vLLM-style
extras and travel as ``extra_body``, exactly as the SDK would have sent them.
"""

from __future__ import annotations

import inspect
from typing import Any

from bridges.runtime import json_rules

_PARAMS_CACHE: dict[Any, frozenset[str]] = {}


def sdk_params(func: Any) -> frozenset[str]:
    params = _PARAMS_CACHE.get(func)
    if params is None:
        params = frozenset(inspect.signature(func).parameters) - {"self"}
        _PARAMS_CACHE[func] = params
    return params


def split_kwargs(body: dict[str, Any], sdk_create: Any) -> dict[str, Any]:
    """JSON body -> ``create`` kwargs: keys the SDK knows stay, the rest are vLLM-style extra_body keys."""
    known = sdk_params(sdk_create)
    kwargs: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in body.items():
        if key in known and key not in ("extra_body", "extra_headers", "extra_query", "timeout"):
            kwargs[key] = value
        else:
            extra[key] = value
    if extra:
        kwargs["extra_body"] = extra
    return kwargs


def response_json(response: Any) -> dict[str, Any]:
    """A response as the JSON an OpenAI-compatible server sends (token-id extras included)."""
    return response.model_dump(mode="json", exclude_unset=True)


def response_bytes(response: Any) -> bytes:
    """``response_json`` serialised, by pydantic in one step (a quarter of the cost of dumping the dict)."""
    return response.__pydantic_serializer__.to_json(response, exclude_unset=True)  # type: ignore[no-any-return,unused-ignore]


def tool_calls_problem(body: dict[str, Any]) -> tuple[str, str] | None:
    """(param, sentence) for the first assistant message whose ``tool_calls`` are not OpenAI's wire
    format (a string ``id``, ``type`` "function", a ``function`` with string ``name`` and ``arguments``);
    None when every call is. Every HTTP face (``bridges.serve``, per-rollout sessions) refuses such a
    body with 400, as the OpenAPI document declares; in-process callers may pass the looser shapes
    ``EngineClient`` accepts."""
    messages = body.get("messages")
    for i, message in enumerate(messages if isinstance(messages, list) else []):
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        for j, call in enumerate(calls if isinstance(calls, list) else []):
            function = call.get("function") if isinstance(call, dict) else None
            if not (
                isinstance(function, dict)
                and isinstance(call.get("id"), str)
                and call.get("type") == "function"
                and isinstance(function.get("name"), str)
                and isinstance(function.get("arguments"), str)
            ):
                where = f"messages[{i}].tool_calls[{j}]"
                return where, (
                    f"'{where}' must have a string 'id', 'type': 'function' and a 'function' with string "
                    "'name' and 'arguments'."
                )
            where = f"messages[{i}].tool_calls[{j}].function.arguments"
            try:  # JSON inside a string is held to the body's own rule; text that is not JSON stays text
                json_rules.loads(function["arguments"], f"'{where}'")
            except json_rules.JsonRuleError as exc:
                if exc.kind != "json":
                    return where, str(exc)
    return None
