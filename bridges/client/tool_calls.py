"""Structured tool calls parsed out of sampled text, for the two families open models use.

- ``hermes`` (Hermes, Qwen2.5, Qwen3, the tiny model): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``,
  several per message, optionally after some plain text.
- ``llama3_json`` (Llama 3.x): the whole reply is a JSON object ``{"name": ..., "parameters": {...}}`` (or
  several separated by ``;``), optionally after ``<|python_tag|>``.

Two choices matter for RL:
- ids are derived from the sampled token ids and the call index, so the same sample always yields
  the same ids (re-scoring, caching and ledger matching stay deterministic), unlike random uuids;
- malformed JSON inside the markup still yields a tool call (name recovered when possible,
  arguments = the raw text). Dropping it would turn a broken call into a plain answer and the
  environment could never tell the model what went wrong.
"""

from __future__ import annotations

import hashlib
import json
import re
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass

TOOL_PARSERS = ("hermes", "llama3_json")

_HERMES_OPEN = "<tool_call>"
_HERMES_CLOSE = "</tool_call>"
_PYTHON_TAG = "<|python_tag|>"
_NAME_RE = re.compile(r'"name"\s*:\s*"((?:[^"\\]|\\.)*)"')
_DECODER = json.JSONDecoder()


@dataclass(frozen=True, slots=True)
class ParsedToolCall:
    """One call: ``arguments`` is a JSON string (or the raw text when the model's JSON was malformed)."""

    id: str
    name: str
    arguments: str
    valid: bool = True

    def to_openai(self) -> dict[str, object]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True, slots=True)
class ParsedReply:
    """``content`` is the text with the tool-call markup removed (None when nothing else was said)."""

    content: str | None
    tool_calls: list[ParsedToolCall]


def tool_call_id(token_ids: Sequence[int], index: int) -> str:
    """``call_<24 hex>``: a hash of the sampled ids and the call's position in the message."""
    digest = hashlib.blake2b(
        array("q", token_ids).tobytes(), digest_size=12, salt=index.to_bytes(8, "little")
    )
    return "call_" + digest.hexdigest()


def _dump_arguments(arguments: object) -> str:
    # vLLM's parsers emit json.dumps(args, ensure_ascii=False); with the default separators this
    # reproduces what Hermes/Qwen templates print, so re-rendering the call costs no drift.
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments, ensure_ascii=False)


def _recover_name(text: str) -> str:
    match = _NAME_RE.search(text)
    if match is None:
        return ""
    try:
        return json.loads(f'"{match.group(1)}"')
    except ValueError:
        return match.group(1)


def _call_from_json(
    raw: str, token_ids: Sequence[int], index: int, args_keys: tuple[str, ...]
) -> ParsedToolCall:
    """Parse one JSON tool-call body; a malformed one keeps the raw text so the env can answer with an error."""
    text = raw.strip()
    try:
        obj, end = _DECODER.raw_decode(text)
        if text[end:].strip() or not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            raise ValueError("not a single tool-call object")
    except ValueError:
        return ParsedToolCall(tool_call_id(token_ids, index), _recover_name(text), text, valid=False)
    arguments: object = {}
    for key in args_keys:
        if key in obj:
            arguments = obj[key]
            break
    return ParsedToolCall(tool_call_id(token_ids, index), obj["name"], _dump_arguments(arguments))


def parse_hermes(text: str, token_ids: Sequence[int]) -> ParsedReply:
    """``<tool_call>`` blocks anywhere in the text; an unclosed last block (truncated sample) still counts."""
    start = text.find(_HERMES_OPEN)
    if start < 0:
        return ParsedReply(text, [])
    calls: list[ParsedToolCall] = []
    pos = start
    while pos >= 0:
        body_start = pos + len(_HERMES_OPEN)
        end = text.find(_HERMES_CLOSE, body_start)
        body = text[body_start:] if end < 0 else text[body_start:end]
        calls.append(_call_from_json(body, token_ids, len(calls), ("arguments", "parameters")))
        if end < 0:
            break
        pos = text.find(_HERMES_OPEN, end + len(_HERMES_CLOSE))
    # The Hermes/Qwen templates print content, then "\n" before the first <tool_call>; undo exactly
    # that newline so re-rendering the message reproduces the sampled text.
    content = text[:start]
    if content.endswith("\n"):
        content = content[:-1]
    return ParsedReply(content or None, calls)


def parse_llama3_json(text: str, token_ids: Sequence[int]) -> ParsedReply:
    """A reply that is (after an optional ``<|python_tag|>``) one or more JSON calls separated by ``;``."""
    body = text.strip()
    tagged = body.startswith(_PYTHON_TAG)
    if tagged:
        body = body[len(_PYTHON_TAG) :].strip()
    if not body.startswith("{"):
        return ParsedReply(text, [])
    calls: list[ParsedToolCall] = []
    pos = 0
    while pos < len(body):
        try:
            obj, end = _DECODER.raw_decode(body, pos)
        except ValueError:
            obj, end = None, -1
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            if calls or tagged or _NAME_RE.search(body, pos):
                # markup that clearly meant a call but is broken: keep it so the env can say so
                calls.append(_call_from_json(body[pos:], token_ids, len(calls), ("parameters", "arguments")))
                break
            return ParsedReply(text, [])
        arguments = obj.get("parameters", obj.get("arguments", {}))
        calls.append(
            ParsedToolCall(tool_call_id(token_ids, len(calls)), obj["name"], _dump_arguments(arguments))
        )
        pos = end
        while pos < len(body) and body[pos] in " \t\n;":
            pos += 1
    return ParsedReply(None, calls)


_PARSERS: dict[str, Callable[[str, Sequence[int]], ParsedReply]] = {
    "hermes": parse_hermes,
    "llama3_json": parse_llama3_json,
}


def get_tool_parser(name: str) -> Callable[[str, Sequence[int]], ParsedReply]:
    """The parser function for ``name``; an unknown name is one sentence listing the known ones."""
    try:
        return _PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown tool_parser '{name}'; choose one of: {', '.join(TOOL_PARSERS)}.") from None
