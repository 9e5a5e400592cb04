"""``stream=True``: a finished response re-cut as OpenAI's chunks, sent as server-sent events.

Engines return whole samples (token-level engines decode a batch to the end before any row is
returned), so a streamed response is emitted once the engine has answered: per choice, a role chunk,
then one chunk each for the reasoning, the content (with its logprobs) and every tool call, then the
finish chunk; with ``stream_options.include_usage`` a last chunk with no choices carries the usage.
What a streaming client assembles from the deltas is exactly the message a whole response holds, so
the turn it sends back enters the token ledger the same way (a test holds this). Our extras ride on
the chunks that end things: each choice's finish chunk has its ``token_ids`` and ``token_logprobs``,
and the last chunk has ``prompt_token_ids``, ``weight_version`` and any drift figures.

The same bytes serve both paths: ``bridges.serve`` writes them to the socket, and ``EngineClient``
hands them to the SDK's own ``AsyncStream`` over an in-memory response, so in-process callers get
the SDK's chunk objects, parsed by the SDK.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from bridges.envs.types import Sample

STREAM_TOP_LEVEL_EXTRAS = ("prompt_token_ids", "weight_version", "drift_tokens", "drifted_turns")
DONE = b"data: [DONE]\n\n"


def _chunk(base: dict[str, Any], choice: dict[str, Any], include_usage: bool) -> dict[str, Any]:
    chunk = {**base, "choices": [choice]}
    if include_usage:
        chunk["usage"] = None  # as on OpenAI: present and null on every chunk but the last
    return chunk


def _chat_choice_chunks(choice: dict[str, Any], sample: Sample) -> list[dict[str, Any]]:
    """The choice's deltas, in the order a model writes them."""
    index, message = choice["index"], choice["message"]

    def delta(fields: dict[str, Any], logprobs: Any = None) -> dict[str, Any]:
        return {"index": index, "delta": fields, "finish_reason": None, "logprobs": logprobs}

    out = [delta({"role": "assistant", "content": ""})]
    if message.get("reasoning_content"):
        out.append(delta({"reasoning_content": message["reasoning_content"]}))
    if message.get("content") or choice.get("logprobs"):
        out.append(delta({"content": message.get("content") or ""}, choice.get("logprobs")))
    for j, call in enumerate(message.get("tool_calls") or ()):
        out.append(delta({"tool_calls": [{"index": j, **call}]}))
    finish = delta({})
    finish.update(finish_reason=choice["finish_reason"], token_ids=sample.token_ids,
                  token_logprobs=sample.logprobs)
    out.append(finish)
    return out


def _completion_choice_chunks(choice: dict[str, Any], sample: Sample) -> list[dict[str, Any]]:
    index = choice["index"]
    text = {"index": index, "text": choice["text"], "finish_reason": None, "logprobs": choice["logprobs"]}
    finish = {"index": index, "text": "", "finish_reason": choice["finish_reason"], "logprobs": None,
              "token_ids": sample.token_ids, "token_logprobs": sample.logprobs}
    return [text, finish]


def stream_chunks(
    payload: dict[str, Any], prompt_ids: list[int], samples: Sequence[Sample], include_usage: bool
) -> list[dict[str, Any]]:
    """A chat (``object: chat.completion``) or text completion payload as the chunks of its stream."""
    chat = payload["object"] == "chat.completion"
    base = {
        "id": payload["id"],
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": payload["created"],
        "model": payload["model"],
    }
    cut = _chat_choice_chunks if chat else _completion_choice_chunks
    chunks = [
        _chunk(base, part, include_usage)
        for choice, sample in zip(payload["choices"], samples, strict=True)
        for part in cut(choice, sample)
    ]
    if include_usage:
        chunks.append({**base, "choices": [], "usage": payload["usage"]})
    last = chunks[-1]
    last["prompt_token_ids"] = prompt_ids
    for key in STREAM_TOP_LEVEL_EXTRAS[1:]:
        if key in payload:
            last[key] = payload[key]
    return chunks


def sse_body(chunks: Sequence[dict[str, Any]]) -> bytes:
    """The chunks as server-sent events, ending with ``data: [DONE]``."""
    parts = [b"data: " + json.dumps(chunk, ensure_ascii=False).encode() + b"\n\n" for chunk in chunks]
    parts.append(DONE)
    return b"".join(parts)
