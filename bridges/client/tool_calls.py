"""Structured tool calls parsed out of sampled text, one parser per tool-call format open models use.

- ``hermes`` (Hermes, Qwen2.5, Qwen3, the tiny model): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``,
  several per message, optionally after some plain text.
- ``llama3_json`` (Llama 3.x): the whole reply is a JSON object ``{"name": ..., "parameters": {...}}`` (or
  several separated by ``;``), optionally after ``<|python_tag|>``.
- ``mistral``: ``[TOOL_CALLS]`` then a JSON list of ``{"name": ..., "arguments": {...}}``.
- ``deepseek_v3``: full-width markup, ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME`` then the arguments
  in a fenced JSON block, one such block per call inside ``<｜tool▁calls▁begin｜>...<｜tool▁calls▁end｜>``.

Each format also names its *opener* (``ToolFormat.opener``): the text a reply starts with when it
calls a tool. ``tool_choice="required"`` or a named function is enforced by appending that opener to
the prompt, the same text the model would have produced itself, so no constrained decoding is needed.

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

from bridges.runtime import json_rules

TOOL_PARSERS = ("hermes", "llama3_json", "mistral", "deepseek_v3")

_HERMES_OPEN = "<tool_call>"
_HERMES_CLOSE = "</tool_call>"
_PYTHON_TAG = "<|python_tag|>"
_MISTRAL_OPEN = "[TOOL_CALLS]"
DEEPSEEK_CALLS_OPEN = "<｜tool▁calls▁begin｜>"
DEEPSEEK_CALLS_CLOSE = "<｜tool▁calls▁end｜>"
DEEPSEEK_CALL_OPEN = "<｜tool▁call▁begin｜>"
DEEPSEEK_CALL_CLOSE = "<｜tool▁call▁end｜>"
DEEPSEEK_SEP = "<｜tool▁sep｜>"
_DEEPSEEK_FENCE_OPEN = "\n```json\n"
_DEEPSEEK_FENCE_CLOSE = "\n```"
_NAME_RE = re.compile(r'"name"\s*:\s*"((?:[^"\\]|\\.)*)"')
_DECODER = json.JSONDecoder()
_OPENING = {"}": "{", "]": "["}


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
    except (ValueError, RecursionError):  # a reply nested thousands deep is text, not a crash
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
    except (ValueError, RecursionError):  # a reply nested thousands deep is text, not a crash
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
        except (ValueError, RecursionError):
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


def parse_mistral(text: str, token_ids: Sequence[int]) -> ParsedReply:
    """``[TOOL_CALLS]`` followed by a JSON list of calls (a single object is accepted too)."""
    start = text.find(_MISTRAL_OPEN)
    if start < 0:
        return ParsedReply(text, [])
    body = text[start + len(_MISTRAL_OPEN) :].strip()
    content = text[:start] or None
    try:
        value, end = _DECODER.raw_decode(body)
        items = value if isinstance(value, list) else [value]
        if (
            body[end:].strip()
            or not items
            or not all(isinstance(i, dict) and isinstance(i.get("name"), str) for i in items)
        ):
            raise ValueError("not a list of tool-call objects")
    except (ValueError, RecursionError):  # a reply nested thousands deep is text, not a crash
        return ParsedReply(content, [_call_from_json(body, token_ids, 0, ("arguments",))])
    calls = [
        ParsedToolCall(tool_call_id(token_ids, i), item["name"], _dump_arguments(item.get("arguments", {})))
        for i, item in enumerate(items)
    ]
    return ParsedReply(content, calls)


def _deepseek_call(block: str, token_ids: Sequence[int], index: int) -> ParsedToolCall:
    """``function<｜tool▁sep｜>NAME\n```json\nARGS\n``` `` (possibly truncated) -> one call."""
    call_id = tool_call_id(token_ids, index)
    sep = block.find(DEEPSEEK_SEP)
    rest = block[sep + len(DEEPSEEK_SEP) :] if sep >= 0 else block
    name, fence, arguments = rest.partition(_DEEPSEEK_FENCE_OPEN)
    if sep < 0 or not fence:
        return ParsedToolCall(call_id, name if sep >= 0 else "", block, valid=False)
    arguments = (
        arguments[: -len(_DEEPSEEK_FENCE_CLOSE)] if arguments.endswith(_DEEPSEEK_FENCE_CLOSE) else arguments
    )
    if not json_rules.embedded(arguments)[0]:
        return ParsedToolCall(call_id, name, arguments, valid=False)
    return ParsedToolCall(call_id, name, arguments)


def parse_deepseek_v3(text: str, token_ids: Sequence[int]) -> ParsedReply:
    """Every ``<｜tool▁call▁begin｜>...<｜tool▁call▁end｜>`` after ``<｜tool▁calls▁begin｜>``; the
    arguments are kept as sampled (the template prints them verbatim inside the fence)."""
    start = text.find(DEEPSEEK_CALLS_OPEN)
    if start < 0:
        return ParsedReply(text, [])
    calls: list[ParsedToolCall] = []
    pos = text.find(DEEPSEEK_CALL_OPEN, start)
    while pos >= 0:
        body_start = pos + len(DEEPSEEK_CALL_OPEN)
        end = text.find(DEEPSEEK_CALL_CLOSE, body_start)
        calls.append(
            _deepseek_call(text[body_start:] if end < 0 else text[body_start:end], token_ids, len(calls))
        )
        if end < 0:
            break
        pos = text.find(DEEPSEEK_CALL_OPEN, end)
    if not calls:  # the opener alone: a call the model began but never wrote
        calls.append(ParsedToolCall(tool_call_id(token_ids, 0), "", text[start:], valid=False))
    return ParsedReply(text[:start] or None, calls)


@dataclass(frozen=True, slots=True)
class ToolFormat:
    """A tool-call format: its parser, and the text a reply calling a tool starts with.

    ``opener_any`` begins a call to a function the model still names itself; ``opener_named`` (with
    ``{name}``) begins a call to that function, ready for its arguments. Both are what the format's
    own template prints, so a prefilled call renders back the way it was sampled.
    """

    name: str
    parse: Callable[[str, Sequence[int]], ParsedReply]
    opener_any: str
    opener_named: str
    closers: tuple[str, ...] = ()  # what ends a named call after its arguments, outermost first

    def opener(self, function: str | None) -> str:
        if function is None:
            return self.opener_any
        return self.opener_named.replace("{name}", json.dumps(function, ensure_ascii=False)[1:-1])

    def arguments_after(self, continuation: str) -> str:
        """What the model wrote after a named opener, without the markup that closes the call: a
        closing bracket goes only where it has no opening one in the text (so it is the call's)."""
        body = continuation.strip()
        for closer in self.closers:
            opening = _OPENING.get(closer)
            if not body.endswith(closer) or (opening and body.count(closer) <= body.count(opening)):
                continue  # absent (a truncated reply), or the arguments' own bracket
            body = body[: -len(closer)].rstrip()
        return body


@dataclass(frozen=True, slots=True)
class ForcedCall:
    """A reply that continues a prefilled tool-call opener (``tool_choice`` required, or a named
    function: ``name``). It is a call whatever the model wrote: to the named function, with only what
    the model wrote after the opener as its arguments when they do not parse (the client can answer
    with an error); with ``required`` the model names the function, and a reply too broken to name one
    is a call named "" holding the text the model wrote."""

    format: ToolFormat
    name: str  # "" for required: the model names the function

    def enforce(self, parsed: ParsedReply, text: str, token_ids: Sequence[int]) -> ParsedReply:
        opener = self.format.opener(self.name or None)
        continuation = text[len(opener) :] if text.startswith(opener) else text
        calls = list(parsed.tool_calls)
        if not self.name:
            if calls:
                return parsed
            return ParsedReply(
                None, [ParsedToolCall(tool_call_id(token_ids, 0), "", continuation, valid=False)]
            )
        if not calls or not calls[0].valid or calls[0].name != self.name:
            arguments = self.format.arguments_after(continuation)
            calls[:1] = [ParsedToolCall(tool_call_id(token_ids, 0), self.name, arguments, valid=False)]
        return ParsedReply(parsed.content, calls)


TOOL_FORMATS: dict[str, ToolFormat] = {
    "hermes": ToolFormat("hermes", parse_hermes, '<tool_call>\n{"name": "', '<tool_call>\n{"name": "{name}", "arguments": ',
                         (_HERMES_CLOSE, "}")),
    "llama3_json": ToolFormat("llama3_json", parse_llama3_json, '{"name": "', '{"name": "{name}", "parameters": ', ("}",)),
    "mistral": ToolFormat("mistral", parse_mistral, '[TOOL_CALLS] [{"name": "', '[TOOL_CALLS] [{"name": "{name}", "arguments": ',
                          ("]", "}")),
    "deepseek_v3": ToolFormat(
        "deepseek_v3",
        parse_deepseek_v3,
        f"{DEEPSEEK_CALLS_OPEN}{DEEPSEEK_CALL_OPEN}function{DEEPSEEK_SEP}",
        f"{DEEPSEEK_CALLS_OPEN}{DEEPSEEK_CALL_OPEN}function{DEEPSEEK_SEP}{{name}}{_DEEPSEEK_FENCE_OPEN}",
        (DEEPSEEK_CALLS_CLOSE, DEEPSEEK_CALL_CLOSE, _DEEPSEEK_FENCE_CLOSE.strip()),
    ),
}


def get_tool_format(name: str) -> ToolFormat:
    """The tool-call format called ``name``; an unknown name is one sentence listing the known ones."""
    try:
        return TOOL_FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown tool_parser '{name}'; choose one of: {', '.join(TOOL_PARSERS)}.") from None


def get_tool_parser(name: str) -> Callable[[str, Sequence[int]], ParsedReply]:
    """The parser function for ``name``; an unknown name is one sentence listing the known ones."""
    return get_tool_format(name).parse
