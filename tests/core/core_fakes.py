"""Helpers for core tests: a scripted remote chat endpoint behind the real openai SDK (httpx.MockTransport), for core tests.

The SDK, its request building, response parsing and error classes are all real; only the server
on the other side of HTTP is scripted, which is what a remote OpenAI-compatible endpoint is.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Callable
from typing import Any

import httpx
import openai


def completion(
    content: str | None = "ok",
    *,
    tool_calls: list[dict[str, Any]] | None = None,
    finish_reason: str = "stop",
    prompt_token_ids: list[int] | None = None,
    token_ids: list[int] | None = None,
    token_logprobs: list[float] | None = None,
    weight_version: int | None = None,
    logprobs: list[float] | None = None,
    usage: tuple[int, int] | None = (5, 3),
) -> dict[str, Any]:
    """ChatCompletion JSON as a server sends it, optionally with the bridges token extras."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish_reason}
    if token_ids is not None:
        choice["token_ids"] = token_ids
    if token_logprobs is not None:
        choice["token_logprobs"] = token_logprobs
    if logprobs is not None:
        choice["logprobs"] = {
            "content": [{"token": "t", "logprob": lp, "bytes": None, "top_logprobs": []} for lp in logprobs]
        }
    body: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [choice],
    }
    if usage is not None:
        body["usage"] = {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}
    if prompt_token_ids is not None:
        body["prompt_token_ids"] = prompt_token_ids
    if weight_version is not None:
        body["weight_version"] = weight_version
    return body


def tool_call(name: str, arguments: str, call_id: str = "call_1") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def error(
    status: int, message: str, code: str | None = None, kind: str = "invalid_request_error"
) -> httpx.Response:
    """An OpenAI-style error body with the given HTTP status."""
    return httpx.Response(
        status, json={"error": {"message": message, "type": kind, "code": code, "param": None}}
    )


Responder = Callable[[dict[str, Any], int], Any]


class ChatServer:
    """Plays a remote /v1/chat/completions endpoint; records requests and peak concurrency."""

    def __init__(self, respond: Responder | None = None) -> None:
        self.respond: Responder = respond or (lambda body, i: completion("ok"))
        self.requests: list[dict[str, Any]] = []
        self.in_flight = 0
        self.peak = 0

    async def handler(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        index = len(self.requests)
        self.requests.append(body)
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            out = self.respond(body, index)
            if inspect.isawaitable(out):
                out = await out
        finally:
            self.in_flight -= 1
        if isinstance(out, httpx.Response):
            return out
        if isinstance(out, str):
            out = completion(out)
        return httpx.Response(200, json=out)

    def client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            api_key="x",
            base_url="http://test/v1",
            max_retries=0,
            http_client=httpx.AsyncClient(transport=httpx.MockTransport(self.handler)),
        )


async def sleep_then(seconds: float, value: Any) -> Any:
    await asyncio.sleep(seconds)
    return value
