"""OpenAI Responses (``POST /v1/responses``) on a session, as Chat Completions underneath.

An agent that speaks Responses (the OpenAI Agents SDK's default model, Codex-style CLIs) is answered
by translating its request into the Chat Completions call it means, sampling that through the same
path and ledger as any chat call (``answer_chat``: recorded, capped, the rollout's sampling arguments
on top), and translating the answer back. So the turns, token ids and branch rule are the chat ones.

Supported: ``input`` as a string or items (messages with text content, ``function_call``,
``function_call_output``; ``reasoning`` items are dropped, they carry no text the template prints),
``instructions``, function ``tools`` and ``tool_choice``, ``max_output_tokens``, ``temperature``,
``top_p``, ``previous_response_id`` (a response earlier in the same session: its conversation and
reply come first), and ``stream`` (the recorded answer re-cut as Responses events). Refused with a
400 naming it: any other tool type (web search, file search, computer use...), non-text content
(images, files), ``background``, and a ``previous_response_id`` this session did not answer.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from bridges.agents.sessions import Session, SessionRefusal

SAMPLING_KEYS = ("temperature", "top_p", "parallel_tool_calls", "user", "metadata", "seed")
NAME = "Responses"
# the top-level fields read here and their JSON types (null is taken as absent): checked before reading
FIELD_TYPES: dict[str, tuple[str, ...]] = {
    "previous_response_id": ("string",), "instructions": ("string",), "input": ("string", "array"),
    "tools": ("array",), "tool_choice": ("string", "object"), "max_output_tokens": ("integer",),
    "temperature": ("number",), "top_p": ("number",), "seed": ("integer",), "stream": ("boolean",),
    "background": ("boolean",), "parallel_tool_calls": ("boolean",), "user": ("string",), "metadata": ("object",),
}


def _refuse(message: str) -> SessionRefusal:
    return SessionRefusal(400, message, "unsupported_responses_input")


def _text(content: Any, where: str) -> str:
    """A Responses content (a string, or text parts) as one string; any other part is refused."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _refuse(f"'{where}.content' must be a string or a list of text parts.")
    parts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text", "text", "refusal"):
            raise _refuse(f"'{where}.content' holds a '{kind}' part; this server takes text parts only.")
        parts.append(str(part.get("text", part.get("refusal", ""))))
    return "".join(parts)


def _append_call(messages: list[dict[str, Any]], item: dict[str, Any]) -> None:
    """A ``function_call`` item joins the assistant message before it (one message, several calls)."""
    call = {"id": str(item.get("call_id") or item.get("id") or ""), "type": "function",
            "function": {"name": str(item.get("name", "")), "arguments": str(item.get("arguments", ""))}}
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant":
        last.setdefault("tool_calls", []).append(call)
        return
    messages.append({"role": "assistant", "content": None, "tool_calls": [call]})


def input_messages(items: Any) -> list[dict[str, Any]]:
    """Responses ``input`` as chat messages."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise _refuse("'input' must be a string or a list of items.")
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message":
            role = {"developer": "system"}.get(item.get("role"), item.get("role"))
            if role not in ("system", "user", "assistant"):
                raise _refuse(f"'input[{i}].role' must be system, developer, user or assistant.")
            messages.append({"role": role, "content": _text(item.get("content", ""), f"input[{i}]")})
        elif kind == "function_call":
            _append_call(messages, item)
        elif kind == "function_call_output":
            output = item.get("output", "")
            text = output if isinstance(output, str) else _text(output, f"input[{i}].output")
            messages.append({"role": "tool", "tool_call_id": str(item.get("call_id", "")), "content": text})
        elif kind != "reasoning":
            raise _refuse(f"'input[{i}]' is a '{kind}' item; this server takes messages and function calls.")
    return messages


def _tools(body: dict[str, Any]) -> dict[str, Any]:
    """``tools`` and ``tool_choice`` in their chat form."""
    out: dict[str, Any] = {}
    tools = body.get("tools") or []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            raise _refuse(f"'tools[{i}]' is a '{kind}' tool; this server runs function tools only.")
    if tools:
        out["tools"] = [{"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters")
                                                            if k in t}} for t in tools]
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function":
        out["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    elif choice in ("auto", "required", "none"):
        out["tool_choice"] = choice
    return out


def to_chat(body: dict[str, Any], session: Session) -> dict[str, Any]:
    """The Chat Completions body a Responses request means."""
    if body.get("background"):
        raise _refuse("'background' responses are not served here; ask without it.")
    if body.get("input") in (None, "", []):  # as the document states (OpenAI's own API reads input as optional)
        raise _refuse("'input' is required and not empty: the items (or text) this response answers.")
    messages: list[dict[str, Any]] = []
    previous = body.get("previous_response_id")
    if previous is not None:
        if previous not in session.threads:
            raise _refuse(f"'previous_response_id' {str(previous)[:60]!r} is not a response of this session.")
        messages = [dict(m) for m in session.threads[previous]]
    if body.get("instructions"):
        messages = [m for m in messages if m["role"] != "system"]  # instructions do not carry over
        messages.insert(0, {"role": "system", "content": str(body["instructions"])})
    messages += input_messages(body.get("input", []))
    chat = {"messages": messages, **_tools(body), **{k: body[k] for k in SAMPLING_KEYS if k in body}}
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    return chat


def from_chat(payload: dict[str, Any], body: dict[str, Any], session: Session) -> dict[str, Any]:
    """A ``response`` object from a chat completion payload (first choice), remembered in the session
    for a later ``previous_response_id``."""
    choice = payload["choices"][0]
    message = choice.get("message") or {}
    output: list[dict[str, Any]] = []
    if message.get("content"):
        output.append({"type": "message", "id": f"msg_{secrets.token_hex(12)}", "status": "completed",
                       "role": "assistant", "content": [{"type": "output_text", "text": message["content"],
                                                         "annotations": []}]})
    for call in message.get("tool_calls") or []:
        output.append({"type": "function_call", "id": f"fc_{secrets.token_hex(12)}", "call_id": call["id"],
                       "name": call["function"]["name"], "arguments": call["function"]["arguments"],
                       "status": "completed"})
    usage = payload.get("usage") or {}
    cut = choice.get("finish_reason") == "length"
    response = {
        "id": f"resp_{secrets.token_hex(12)}", "object": "response", "created_at": int(time.time()),
        "model": payload.get("model"), "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None, "error": None,
        "output": output, "instructions": body.get("instructions"), "tools": body.get("tools") or [],
        "tool_choice": body.get("tool_choice", "auto"), "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"), "temperature": body.get("temperature"),
        "top_p": body.get("top_p"), "max_output_tokens": body.get("max_output_tokens"), "metadata": {},
        "usage": {"input_tokens": usage.get("prompt_tokens", 0), "output_tokens": usage.get("completion_tokens", 0),
                  "total_tokens": usage.get("total_tokens", 0), "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens_details": {"reasoning_tokens": 0}},
    }
    session.threads[response["id"]] = session.last_exchange()
    return response


def events(response: dict[str, Any]) -> list[dict[str, Any]]:
    """The Responses stream of a finished response: created, each output item with its deltas, completed."""
    shell = {**response, "status": "in_progress", "output": [], "usage": None}
    out: list[dict[str, Any]] = [{"type": "response.created", "response": shell},
                                 {"type": "response.in_progress", "response": shell}]
    for index, item in enumerate(response["output"]):
        out.append({"type": "response.output_item.added", "output_index": index,
                    "item": {**item, "status": "in_progress", **_empty(item)}})
        out += _item_deltas(index, item)
        out.append({"type": "response.output_item.done", "output_index": index, "item": item})
    out.append({"type": "response.completed" if response["status"] == "completed" else "response.incomplete",
                "response": response})
    return [{**event, "sequence_number": n} for n, event in enumerate(out)]


def _empty(item: dict[str, Any]) -> dict[str, Any]:
    return {"content": []} if item["type"] == "message" else {"arguments": ""}


def _item_deltas(index: int, item: dict[str, Any]) -> list[dict[str, Any]]:
    where = {"output_index": index, "item_id": item["id"]}
    if item["type"] == "function_call":
        return [{"type": "response.function_call_arguments.delta", **where, "delta": item["arguments"]},
                {"type": "response.function_call_arguments.done", **where, "arguments": item["arguments"]}]
    part = item["content"][0]
    at = {**where, "content_index": 0}
    return [
        {"type": "response.content_part.added", **at, "part": {**part, "text": ""}},
        {"type": "response.output_text.delta", **at, "delta": part["text"], "logprobs": []},
        {"type": "response.output_text.done", **at, "text": part["text"], "logprobs": []},
        {"type": "response.content_part.done", **at, "part": part},
    ]
