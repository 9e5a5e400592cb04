"""One rule for every JSON document a server reads: how deep it may nest, and that its text is Unicode.

Why one rule, checked where the JSON is parsed: Python's parser is recursive (a body nested ~1,000 deep
raises ``RecursionError``), and so is much of what reads a parsed body afterwards (rendering a tool's
parameters, copying them, pydantic, ``json.dumps``) at depths well below that, so a deep body that the
parser took could end in a 500 anywhere later. And a JSON string may hold a lone UTF-16 surrogate
(``"\\ud800"``): valid JSON, but no UTF-8 encoder or tokenizer takes it, so it would fail wherever the
text is first encoded (an error message, a log line, the tokenizer). Every body and every JSON document
carried inside a string (tool call arguments, safetensors metadata, a weight manifest) is held to the
same two checks, and a violation is one sentence naming where.
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_DEPTH = 64  # arrays and objects inside each other; tool schemas and agent bodies use under 20
# a lone surrogate can only come from a \uD800-\uDFFF escape, or from its raw UTF-8 bytes (ED A0..BF ..),
# which the parser decodes with surrogatepass: bodies without either skip the string check
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE_BYTES = re.compile(rb"\xed[\xa0-\xbf]")


class JsonRuleError(ValueError):
    """A JSON document past the depth rule, not valid JSON, or holding a lone surrogate: one sentence.
    ``kind``: ``"depth"``, ``"json"`` or ``"unicode"``; ``where``: the path of the text at fault, if any."""

    def __init__(self, message: str, kind: str, where: str | None = None) -> None:
        super().__init__(message)
        self.kind, self.where = kind, where


def _too_deep_error(what: str) -> JsonRuleError:
    return JsonRuleError(f"{what} is nested too deeply (at most {MAX_DEPTH} levels of arrays and objects).", "depth")


def loads(data: bytes | str, what: str = "the request body") -> Any:
    """``json.loads`` held to the rule; ``what`` names the document in the sentence."""
    try:
        value = json.loads(data)
    except RecursionError:
        raise _too_deep_error(what) from None
    except (ValueError, UnicodeDecodeError):
        raise JsonRuleError(f"{what} is not valid JSON.", "json") from None
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    escaped = b"\\u" in raw and _SURROGATE_ESCAPE.search(raw) is not None
    check(value, what, strings=escaped or (b"\xed" in raw and _SURROGATE_BYTES.search(raw) is not None))
    return value


def embedded(text: str) -> tuple[bool, Any]:
    """JSON carried in a string that need not be JSON (a tool call's arguments, as a model wrote them):
    (True, value) when it parses within the rule, else (False, None), whatever went wrong (a reply nested
    thousands deep is text, not a crash)."""
    try:
        return True, loads(text, "the embedded JSON")
    except JsonRuleError:
        return False, None


def check(value: Any, what: str = "the request body", *, strings: bool = True) -> None:
    """``value`` (parsed JSON) nests at most ``MAX_DEPTH`` deep and (``strings``) every key and string
    encodes as UTF-8; else ``JsonRuleError`` naming where (the path is found only when something is wrong).
    Only containers are walked for the depth (a chat body holds a few dozen), strings only when asked."""
    if strings and _where(value, "", 0) is not None:
        raise _surrogate(value, what)
    if (type(value) is dict or type(value) is list) and _too_deep(value, 0):
        raise _too_deep_error(what)


def _too_deep(node: Any, depth: int) -> bool:
    """Whether a container nests past ``MAX_DEPTH`` (recursion bounded by it)."""
    if depth >= MAX_DEPTH:
        return True
    for child in node.values() if type(node) is dict else node:
        kind = type(child)
        if (kind is dict or kind is list) and _too_deep(child, depth + 1):
            return True
    return False


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _surrogate(value: Any, what: str) -> JsonRuleError:
    where = _where(value, "", 0)
    place = f"'{where[:200]}'" if where else what
    return JsonRuleError(f"{place} holds an unpaired UTF-16 surrogate, which is not valid text.", "unicode",
                         where[:200] if where else None)


def _where(node: Any, path: str, depth: int) -> str | None:
    """The path of the first key or string that does not encode ("" for the document itself); None when
    all do. Recursive, so it stops at ``MAX_DEPTH`` (the depth check refuses deeper documents anyway)."""
    if isinstance(node, str):
        return None if _encodes(node) else path
    if depth > MAX_DEPTH:
        return None
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, item in items:
        if isinstance(key, str) and not _encodes(key):
            return f"{path}.{_printable(key)}".lstrip(".")
        found = _where(item, f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}".lstrip("."), depth + 1)
        if found is not None:
            return found
    return None


def _printable(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
