"""A recorded response re-cut as the stream an agent asked for.

A session samples every call whole, so that the record holds the response with its token ids; an
agent that asked to stream gets the same content as the events its SDK parses, in one burst. The
content is identical to the non-streamed answer; only the framing differs.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any


def sse(events: Iterable[dict[str, Any]], named: bool = False, done: bool = False) -> bytes:
    """Server-sent events: ``data:`` lines (with ``event:`` lines when ``named``, as Responses and
    Anthropic Messages frame them), closed by ``data: [DONE]`` when ``done`` (Chat Completions)."""
    parts = []
    for event in events:
        head = f"event: {event['type']}\n" if named else ""
        parts.append(f"{head}data: {json.dumps(event, ensure_ascii=False)}\n\n".encode())
    if done:
        parts.append(b"data: [DONE]\n\n")
    return b"".join(parts)


def chat_chunks(payload: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
    """A ``chat.completion`` as ``chat.completion.chunk`` events: per choice, one delta with the whole
    message (tool calls indexed as the stream format requires), then its finish reason."""
    base: dict[str, Any] = {k: payload[k] for k in ("id", "created", "model") if k in payload}
    base["object"] = "chat.completion.chunk"
    chunks = []
    for choice in payload.get("choices", []):
        message = choice.get("message") or {}
        delta: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
        if message.get("tool_calls"):
            delta["tool_calls"] = [{**call, "index": i} for i, call in enumerate(message["tool_calls"])]
        index = choice.get("index", 0)
        chunks.append({**base, "choices": [{"index": index, "delta": delta, "finish_reason": None}]})
        chunks.append({**base, "choices": [{"index": index, "delta": {}, "finish_reason": choice.get("finish_reason")}]})
    if include_usage and payload.get("usage") is not None:
        chunks.append({**base, "choices": [], "usage": payload["usage"]})
    return chunks


def chat_stream(payload: dict[str, Any], body: dict[str, Any]) -> bytes:
    """The Chat Completions stream a request ``body`` asked for (``stream_options.include_usage``)."""
    options = body.get("stream_options")
    usage = isinstance(options, dict) and bool(options.get("include_usage"))
    return sse(chat_chunks(payload, usage), done=True)
