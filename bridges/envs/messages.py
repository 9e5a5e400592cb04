"""Normalise chat messages from any source into plain OpenAI dicts.

Environments, the client layer and the results writer all see messages coming from three places:
plain dicts (datasets, environment code), openai SDK pydantic objects (``ChatCompletionMessage``
returned by a client) and verifiers-style objects with attributes. Everything downstream (ledger
matching, JSON records, chat templates) wants one shape, so this module is the single place that
decides it. It sits on the hot path of every model call, hence the quick path for dicts that are
already in canonical form.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

_KNOWN_KEYS = frozenset({"role", "content", "tool_calls", "tool_call_id", "name", "reasoning_content"})
_OPTIONAL_KEYS = ("tool_call_id", "name", "reasoning_content")


_FIELD, _EXTRA, _ATTRIBUTE = 0, 1, 2
_KINDS: dict[tuple[type, str], int] = {}  # (pydantic model class, name) -> where that name lives


def _kind(cls: type, key: str) -> int:
    kind = _KINDS.get((cls, key))
    if kind is None:
        fields = cls.__pydantic_fields__  # type: ignore[attr-defined]
        # a property or method of the class: only getattr knows what it returns
        kind = _ATTRIBUTE if hasattr(cls, key) else _FIELD if key in fields else _EXTRA
        if len(_KINDS) < 4096:
            _KINDS[(cls, key)] = kind
    return kind


def read_field(obj: Any, key: str) -> Any:
    """``obj[key]`` for a dict; for an object its attribute, else its pydantic extra, else None.

    SDK pydantic objects are read through their declared fields and ``__pydantic_extra__`` directly
    (where a name lives is found once per class): ``getattr`` on a name a model does not declare
    goes through pydantic's ``__getattr__`` and a caught ``AttributeError``, and a response is read
    a dozen times per model call.
    """
    if isinstance(obj, dict):
        return obj.get(key)
    cls = type(obj)
    if hasattr(cls, "__pydantic_fields__"):
        kind = _kind(cls, key)
        if kind == _FIELD:
            return obj.__dict__.get(key)
        if kind == _EXTRA:
            extra = obj.__pydantic_extra__
            return extra.get(key) if extra else None
    value = getattr(obj, key, None)
    if value is None:
        extra = getattr(obj, "model_extra", None)
        if extra:
            value = extra.get(key)
    return value


def _content_to_str(content: Any) -> str | None:
    """Join text parts; multimodal parts other than text carry no text and are dropped."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        parts: list[str] = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
                continue
            kind = read_field(part, "type")
            text = read_field(part, "text")
            if (kind in (None, "text", "input_text", "output_text")) and isinstance(text, str):
                parts.append(text)
        return "".join(parts)
    return str(content)


def _tool_call_to_dict(call: Any) -> dict[str, Any]:
    function = read_field(call, "function")
    if function is None:  # flat shape {"id", "name", "arguments"} used by some libraries
        name, arguments = read_field(call, "name"), read_field(call, "arguments")
    else:
        name, arguments = read_field(function, "name"), read_field(function, "arguments")
    if arguments is None:
        arguments = "{}"
    elif not isinstance(arguments, str):
        arguments = json.dumps(arguments)
    return {
        "id": read_field(call, "id") or "",
        "type": "function",
        "function": {"name": name or "", "arguments": arguments},
    }


def _is_canonical(message: dict[str, Any]) -> bool:
    if not message.keys() <= _KNOWN_KEYS or "role" not in message:
        return False
    content = message.get("content")
    if content is None:
        if message["role"] != "assistant" or "content" not in message:
            return False
    elif not isinstance(content, str):
        return False
    if any(key in message and message[key] is None for key in _OPTIONAL_KEYS):
        return False
    calls = message.get("tool_calls")
    if calls is None:
        return "tool_calls" not in message
    for call in calls:
        if not isinstance(call, dict) or call.get("type") != "function" or "id" not in call:
            return False
        function = call.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
            return False
    return bool(calls)


def to_message_dict(message: Any) -> dict[str, Any]:
    """Return ``message`` as a fresh plain dict with the canonical key set.

    Keys: ``role``, ``content`` (a string; ``None`` kept only for an assistant message that only calls
    tools), and only when present ``tool_calls``, ``tool_call_id``, ``name``, ``reasoning_content``.
    """
    if isinstance(message, dict) and _is_canonical(message):
        copied = dict(message)
        if "tool_calls" in copied:
            copied["tool_calls"] = [
                {"id": c["id"], "type": "function", "function": dict(c["function"])}
                for c in copied["tool_calls"]
            ]
        return copied
    role = read_field(message, "role")
    if role is None:
        raise ValueError(f"a chat message needs a 'role'; got {type(message).__name__} {message!r:.200}.")
    role = str(getattr(role, "value", role))
    content = _content_to_str(read_field(message, "content"))
    out: dict[str, Any] = {"role": role, "content": content}
    calls = read_field(message, "tool_calls")
    if calls:
        out["tool_calls"] = [_tool_call_to_dict(call) for call in calls]
    if content is None and not (role == "assistant" and calls):
        out["content"] = ""
    for key in _OPTIONAL_KEYS:
        value = read_field(message, key)
        if value is not None:
            out[key] = value
    return out


def to_message_dicts(messages: Iterable[Any] | None) -> list[dict[str, Any]]:
    """Normalise a whole conversation (``None`` -> empty list; a bare string -> one user message)."""
    if messages is None:
        return []
    if isinstance(messages, str):
        return [{"role": "user", "content": messages}]
    return [to_message_dict(m) for m in messages]
