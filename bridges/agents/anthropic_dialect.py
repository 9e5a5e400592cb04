"""Anthropic Messages (``POST /v1/messages``) on a session, as Chat Completions underneath.

Translated like the Responses dialect: the request becomes the chat call it means, sampled and
recorded by ``answer_chat``, and the answer is translated back, so turns, ids and the branch rule are
the chat ones. Set ``ANTHROPIC_BASE_URL`` to the session's root (``AgentEnv`` does): Anthropic's SDK
appends ``/v1/messages`` itself.

Supported: ``system`` (a string or text blocks), ``messages`` with text, ``tool_use`` and
``tool_result`` blocks, ``tools`` (``input_schema``), ``tool_choice`` (auto, any, tool, none),
``max_tokens`` (required, as Anthropic requires it), ``stop_sequences``, ``temperature``, ``top_p``,
and ``stream`` (the recorded answer re-cut as message/content-block events). A tool call whose
arguments are not a JSON object (a model's malformed call) comes back as ``tool_use`` with input
``{"arguments": <the text>}``, since Anthropic's format has no place for raw text. Refused with a 400
naming it: images, documents and any other block type, and server tools. Errors come in Anthropic's
error shape (``{"type": "error", "error": {...}}``).
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from bridges.agents.sessions import Session, SessionRefusal
from bridges.runtime import json_rules

NAME = "Messages"
# the top-level fields read here and their JSON types (null is taken as absent): checked before reading
FIELD_TYPES: dict[str, tuple[str, ...]] = {
    "messages": ("array",), "system": ("string", "array"), "max_tokens": ("integer",),
    "stop_sequences": ("array",), "tools": ("array",), "tool_choice": ("object",), "temperature": ("number",),
    "top_p": ("number",), "top_k": ("integer",), "stream": ("boolean",), "metadata": ("object",),
}

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def _refuse(message: str) -> SessionRefusal:
    return SessionRefusal(400, message, "invalid_request_error")


def error_shape(payload: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI-shaped error body in Anthropic's shape."""
    error = payload.get("error") or {}
    return {"type": "error", "error": {"type": "invalid_request_error", "message": str(error.get("message", ""))}}


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
        raise _refuse(f"'{where}' must be a string or a list of content blocks.")
    return content


def _block_text(content: Any, where: str) -> str:
    texts = []
    for block in _blocks(content, where):
        if block.get("type") != "text":
            raise _refuse(f"'{where}' holds a '{block.get('type')}' block; this server takes text blocks here.")
        texts.append(str(block.get("text", "")))
    return "".join(texts)


def _message(role: str, blocks: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """One Anthropic message as chat messages: tool results become tool messages, tool uses calls."""
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "tool_use" and role == "assistant":
            arguments = json.dumps(block.get("input", {}), ensure_ascii=False)
            calls.append({"id": str(block.get("id", "")), "type": "function",
                          "function": {"name": str(block.get("name", "")), "arguments": arguments}})
        elif kind == "tool_result" and role == "user":
            text = _block_text(block.get("content", ""), f"{where}.content[{j}].content")
            out.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id", "")), "content": text})
        elif kind not in ("thinking", "redacted_thinking"):
            raise _refuse(f"'{where}.content[{j}]' is a '{kind}' block; this server takes text, tool_use and tool_result.")
    if texts or calls or not out:
        message: dict[str, Any] = {"role": role, "content": "".join(texts) if texts or not calls else None}
        if calls:
            message["tool_calls"] = calls
        out.append(message)
    return out


def to_chat(body: dict[str, Any], session: Session) -> dict[str, Any]:
    """The Chat Completions body an Anthropic Messages request means."""
    from bridges.client.arguments import integral

    if integral(body.get("max_tokens")) is None:  # by value: JSON's 8.0 is 8
        raise _refuse("'max_tokens' is required and must be an integer.")
    messages: list[dict[str, Any]] = []
    if body.get("system"):
        messages.append({"role": "system", "content": _block_text(body["system"], "system")})
    for i, message in enumerate(body.get("messages") or []):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("user", "assistant"):
            raise _refuse(f"'messages[{i}].role' must be user or assistant.")
        messages += _message(role, _blocks(message.get("content", ""), f"messages[{i}].content"), f"messages[{i}]")
    chat: dict[str, Any] = {"messages": messages, "max_tokens": body["max_tokens"]}
    for key in ("temperature", "top_p"):
        if key in body:
            chat[key] = body[key]
    if body.get("stop_sequences"):
        chat["stop"] = list(body["stop_sequences"])
    chat.update(_tools(body))
    return chat


def _tools(body: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    tools = body.get("tools") or []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or "input_schema" not in tool:
            raise _refuse(f"'tools[{i}]' is not a client tool with an input_schema; server tools are not run here.")
    if tools:
        out["tools"] = [{"type": "function", "function": {"name": t.get("name"), "description": t.get("description", ""),
                                                          "parameters": t["input_schema"]}} for t in tools]
    choice = body.get("tool_choice") or {}
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "any":
        out["tool_choice"] = "required"
    elif kind == "tool":
        out["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    elif kind in ("auto", "none"):
        out["tool_choice"] = kind
    return out


def from_chat(payload: dict[str, Any], body: dict[str, Any], session: Session) -> dict[str, Any]:
    """An Anthropic ``message`` from a chat completion payload (first choice)."""
    choice = payload["choices"][0]
    message = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        content.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                        "input": _tool_input(call["function"]["arguments"])})
    usage = payload.get("usage") or {}
    return {
        "id": f"msg_{secrets.token_hex(12)}", "type": "message", "role": "assistant", "model": payload.get("model"),
        "content": content, "stop_reason": STOP_REASONS.get(choice.get("finish_reason"), "end_turn"),
        "stop_sequence": None,
        "usage": {"input_tokens": usage.get("prompt_tokens", 0), "output_tokens": usage.get("completion_tokens", 0)},
    }


def _tool_input(arguments: str) -> dict[str, Any]:
    _, parsed = json_rules.embedded(arguments)
    return parsed if isinstance(parsed, dict) else {"arguments": arguments}


def events(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The Messages stream of a finished message: start, each block with its delta, delta, stop."""
    start = {**message, "content": [], "stop_reason": None, "usage": {**message["usage"], "output_tokens": 0}}
    out: list[dict[str, Any]] = [{"type": "message_start", "message": start}]
    for index, block in enumerate(message["content"]):
        opened: dict[str, Any]
        if block["type"] == "text":
            opened, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": block["text"]}
        else:
            opened = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)}
        out += [{"type": "content_block_start", "index": index, "content_block": opened},
                {"type": "content_block_delta", "index": index, "delta": delta},
                {"type": "content_block_stop", "index": index}]
    out.append({"type": "message_delta", "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": message["usage"]["output_tokens"]}})
    out.append({"type": "message_stop"})
    return out
