"""OpenAI-style JSON bodies <-> ``create`` keyword arguments, shared by ``bridges.serve`` (real HTTP)
and ``EngineClient``'s in-process transport (code that calls the SDK's generic ``client.post``).

A body's keys that the SDK's ``create`` knows become keyword arguments; the rest are vLLM-style
extras and travel as ``extra_body``, exactly as the SDK would have sent them.
"""

from __future__ import annotations

import inspect
from typing import Any

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
