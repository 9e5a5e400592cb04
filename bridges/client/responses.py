"""Engine samples -> OpenAI response payloads (plain dicts, validated once by the caller).

The text shown to the environment is derived from the sampled ids, never the other way round:
special tokens are kept (an environment may grade markup) except the trailing end-of-turn token,
the text is cut at the matched stop string (as the OpenAI API does), a leading reasoning block
(``<think>...</think>`` for the families that have one) goes to ``reasoning_content`` and tool-call
markup becomes ``tool_calls``.
The ids themselves travel untouched in the extras (``token_ids``, ``token_logprobs``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

from bridges.client.tool_calls import ForcedCall, ParsedReply
from bridges.envs.types import Sample


def reply_text(
    decode: Callable[[Sequence[int]], str],
    sample: Sample,
    end_ids: Collection[int],
    prefill: Sequence[int] = (),
) -> str:
    """Decoded sampled text without the trailing end-of-turn id, cut at the matched stop string.

    ``prefill``: ids appended to the prompt that the reply continues (a forced tool call's opener);
    decoded together with the sample, since a byte-level token may complete a character they began.
    """
    ids = sample.token_ids
    if ids and sample.finish_reason == "stop" and ids[-1] in end_ids:
        ids = ids[:-1]
    text = decode([*prefill, *ids] if prefill else ids)
    stop_str = sample.stop_str
    if stop_str:
        at = text.find(stop_str)
        if at >= 0:
            text = text[:at]
    return text


def split_reasoning(text: str, markers: tuple[str, str] | None) -> tuple[str | None, str]:
    """(reasoning, content) for a reply that opens with ``markers[0]``; an unclosed block is all reasoning."""
    if markers is None or not text.startswith(markers[0]):
        return None, text
    opening, closing = markers
    end = text.find(closing, len(opening))
    if end < 0:
        return text[len(opening) :], ""
    return text[len(opening) : end], text[end + len(closing) :]


def _token_entry(decode: Callable[[Sequence[int]], str], token_id: int, logprob: float) -> dict[str, Any]:
    token = decode([token_id])
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}


def logprob_entries(
    decode: Callable[[Sequence[int]], str],
    ids: Sequence[int],
    logprobs: Sequence[float],
    top: Sequence[Sequence[tuple[int, float]]] | None = None,
) -> list[dict]:
    """``choices[i].logprobs.content``: one entry per sampled id, with its alternatives when ``top``."""
    out = []
    for i, (token_id, logprob) in enumerate(zip(ids, logprobs, strict=True)):
        entry = _token_entry(decode, token_id, logprob)
        entry["top_logprobs"] = [_token_entry(decode, t, lp) for t, lp in top[i]] if top is not None else []
        out.append(entry)
    return out


def chat_choice(
    index: int,
    sample: Sample,
    text: str,
    parse: Callable[[str, Sequence[int]], ParsedReply] | None,
    logprobs: list[dict] | None,
    reasoning_markers: tuple[str, str] | None,
    forced: ForcedCall | None = None,
    declared: Collection[str] | None = None,
) -> dict[str, Any]:
    """One ``choices[i]`` dict (message, finish_reason, extras).

    ``forced``: the reply continues a prefilled tool-call opener (``tool_choice`` required, or a
    named function), so it is a tool call even when the model wrote it too badly to parse
    (``ForcedCall.enforce``), for the environment or agent to answer with an error.
    ``declared``: the request's tool names. A call to no declared name (a ``<tool_call>`` too broken to
    name one, or a name the request never offered) is not a call: an agent framework would fail on
    it ("Tool not found"). It is left out, and a reply left with no call is the text the model wrote.
    """
    reasoning, content = split_reasoning(text, reasoning_markers)
    message: dict[str, Any] = {"role": "assistant", "content": content}
    finish_reason: str = sample.finish_reason
    if parse is not None:
        parsed = parse(content, sample.token_ids)
        if forced is not None:
            parsed = forced.enforce(parsed, content, sample.token_ids)
        calls = parsed.tool_calls
        if declared is not None:
            calls = [call for call in calls if call.name and call.name in declared]
        if calls:
            message["content"] = parsed.content
            message["tool_calls"] = [call.to_openai() for call in calls]
            finish_reason = "tool_calls"
    message["reasoning_content"] = reasoning
    return {
        "index": index,
        "message": message,
        "finish_reason": finish_reason,
        "logprobs": {"content": logprobs} if logprobs is not None else None,
    }


def completion_choice(index: int, sample: Sample, text: str, logprobs: list[dict] | None) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": index,
        "text": text,
        "finish_reason": sample.finish_reason,
        "logprobs": None,
    }
    if logprobs is not None:
        offsets, at = [], 0
        for entry in logprobs:
            offsets.append(at)
            at += len(entry["token"])
        choice["logprobs"] = {
            "tokens": [e["token"] for e in logprobs],
            "token_logprobs": [e["logprob"] for e in logprobs],
            "text_offset": offsets,
            "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in logprobs]
            if logprobs and logprobs[0]["top_logprobs"]
            else None,
        }
    return choice


def validate_with_ids(
    model_cls: Any, payload: dict[str, Any], prompt_ids: list[int], samples: Sequence[Sample]
) -> Any:
    """``model_cls.model_validate(payload)``, then the id lists attached as extras.

    Validating a list-valued extra walks the list (~15 ns per element: 60 us for a 4k-token prompt,
    on every call); attaching the lists after validation gives the same model in O(1).
    """
    response = model_cls.model_validate(payload)
    _set_extra(response, "prompt_token_ids", prompt_ids)
    for choice, sample in zip(response.choices, samples, strict=True):
        _set_extra(choice, "token_ids", sample.token_ids)
        _set_extra(choice, "token_logprobs", sample.logprobs)
    return response


def _set_extra(model: Any, name: str, value: Any) -> None:
    model.__pydantic_extra__[name] = value
    model.__pydantic_fields_set__.add(name)


def usage(prompt_len: int, samples: Sequence[Sample]) -> dict[str, int]:
    completion = len(samples[0].token_ids) if len(samples) == 1 else sum(len(s.token_ids) for s in samples)
    return {
        "prompt_tokens": prompt_len,
        "completion_tokens": completion,
        "total_tokens": prompt_len + completion,
    }
