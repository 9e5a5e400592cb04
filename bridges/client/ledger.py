"""The token ledger: turn k+1's prompt ids extend turn k's prompt + sampled ids exactly (docs/design.md §2).

A conversation is found by its message prefix, not by an id the caller must carry: every reply the
client produces is recorded under a rolling hash of (normalised messages..., the reply). A later
request whose messages start with that prefix, under the same tools, extends the record. Normalisation keeps only
what the template renders from history (role, content, tool calls as name + arguments,
tool_call_id), so an SDK ``ChatCompletionMessage`` fed back as-is and its dict form match.

Records are chained: each holds only the ids its own turn added and a pointer to its parent, and
live in a bounded LRU, so memory stays flat over millions of calls; a record evicted from the LRU
lives on only while a descendant still points at it.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bridges.envs.messages import read_field
from bridges.runtime import json_rules

_HASH_SEED = "rl-bridges-ledger-v1"


def _canonical_arguments(arguments: Any) -> str:
    """Arguments compared as JSON values, so re-serialised (but equal) arguments still match."""
    if isinstance(arguments, str):
        parsed, value = json_rules.embedded(arguments)  # within the depth rule, or compared as text
        if not parsed:
            return arguments
    else:
        value = arguments
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)


def _tool_calls_key(tool_calls: Any) -> tuple[tuple[str, str], ...]:
    out = []
    for call in tool_calls:
        fn = read_field(call, "function")
        if fn is None:  # flat {"name", "arguments"} (verifiers Gen B ToolCall)
            fn = call
        out.append((str(read_field(fn, "name")), _canonical_arguments(read_field(fn, "arguments"))))
    return tuple(out)


def message_key(message: Any) -> tuple[Any, ...]:
    """What identifies a message for prefix matching: role, content, tool calls, tool_call_id."""
    if type(message) is dict:  # hot path: plain dicts without tool calls
        role = message.get("role")
        content = message.get("content")
        tool_calls = message.get("tool_calls")
        tool_call_id = message.get("tool_call_id")
    else:
        role = read_field(message, "role")
        content = read_field(message, "content")
        tool_calls = read_field(message, "tool_calls")
        tool_call_id = read_field(message, "tool_call_id")
    if role is None:
        raise ValueError(f"every chat message needs a 'role'; got {message!r:.120}.")
    if content is None:
        content = ""
    elif not isinstance(content, str):  # content parts: compare their JSON form
        parts = [p.model_dump(exclude_none=True) if hasattr(p, "model_dump") else p for p in content]
        content = ("parts", json.dumps(parts, sort_keys=True, default=str))
    calls = _tool_calls_key(tool_calls) if tool_calls else ()
    return (role, content, calls, tool_call_id)


def tools_key(tools: Sequence[Any] | None) -> str | None:
    """A canonical string for a tools list (it changes the rendered prompt, so it is part of the key)."""
    if not tools:
        return None
    dumped = [t.model_dump(exclude_none=True) if hasattr(t, "model_dump") else t for t in tools]
    return json.dumps(dumped, sort_keys=True, ensure_ascii=False, default=str)


def prefix_hashes(messages: Sequence[Any]) -> list[int]:
    """``h[i]`` identifies ``messages[:i]``; O(len(messages)).

    The tools are not hashed in: ``measure_drift(messages)`` must find a conversation without being
    told its tools. Each record keeps its tools key instead, and extension checks it.
    """
    h = hash(_HASH_SEED)
    out = [h]
    append = out.append
    for message in messages:
        if type(message) is dict and not message.get("tool_calls"):  # hot path, same key as message_key
            role = message.get("role")
            content = message.get("content")
            if role is not None and type(content) is str:
                h = hash((h, (role, content, (), message.get("tool_call_id"))))
                append(h)
                continue
        h = hash((h, message_key(message)))
        append(h)
    return out


def extend_hash(prefix_hash: int, message: Any) -> int:
    return hash((prefix_hash, message_key(message)))


@dataclass(slots=True, eq=False)
class LedgerRecord:
    """One model call. Prompt = parent's history + ``added`` (or ``added`` alone when ``restart``).

    ``closing`` are the end-of-turn ids the template prints after this reply that the engine did
    not sample; together with the next turn's ``added`` they are the mask-0 ids between two turns.
    """

    parent: LedgerRecord | None
    added: Sequence[int]
    sampled: Sequence[int]
    closing: Sequence[int]
    num_prompt_messages: int
    tools: Any
    tools_key: str | None
    restart: bool  # ``added`` is a full render, not an extension of the parent's ids
    drifted: bool  # the prefix was known but the new messages could not be bridged cleanly
    prefilled: int = 0  # the last ids of ``added`` the client appended itself (a forced tool-call opener)

    def _segments(self, include_self_reply: bool) -> list[Sequence[int]]:
        segments: list[Sequence[int]] = []
        if include_self_reply:
            segments += (self.closing, self.sampled)
        segments.append(self.added)
        record = self
        while not record.restart and record.parent is not None:
            record = record.parent
            segments += (record.closing, record.sampled, record.added)
        segments.reverse()
        return segments

    def prompt_ids(self) -> list[int]:
        """The prompt ids the engine saw for this call."""
        out: list[int] = []
        for segment in self._segments(False):
            out += segment
        return out

    def history_ids(self) -> list[int]:
        """Prompt + sampled + closing ids: the exact prefix the next turn extends."""
        out: list[int] = []
        for segment in self._segments(True):
            out += segment
        return out


class TokenLedger:
    """Bounded LRU of ledger records keyed by the prefix hash of (messages..., assistant reply)."""

    def __init__(self, capacity: int = 65536) -> None:
        if capacity < 1:
            raise ValueError(f"ledger_capacity must be at least 1, got {capacity}.")
        self.capacity = capacity
        self._records: OrderedDict[int, LedgerRecord] = OrderedDict()

    def __len__(self) -> int:
        return len(self._records)

    def get(self, key: int) -> LedgerRecord | None:
        record = self._records.get(key)
        if record is not None:
            self._records.move_to_end(key)
        return record

    def longest_prefix(self, hashes: list[int]) -> tuple[LedgerRecord | None, int]:
        """The record of the longest recorded prefix and how many messages it covers (0: none)."""
        records = self._records
        for i in range(len(hashes) - 1, 0, -1):
            record = records.get(hashes[i])
            if record is not None:
                records.move_to_end(hashes[i])
                return record, i
        return None, 0

    def put(self, key: int, record: LedgerRecord) -> None:
        records = self._records
        records[key] = record
        records.move_to_end(key)
        if len(records) > self.capacity:
            records.popitem(last=False)


def count_drift(ledger_ids: Sequence[int], scratch_ids: Sequence[int]) -> int:
    """Positions where two id sequences differ, counting a length difference as differing positions."""
    if ledger_ids == scratch_ids:  # the usual case, compared in C
        return 0
    diff = sum(1 for a, b in zip(ledger_ids, scratch_ids, strict=False) if a != b)
    return diff + abs(len(ledger_ids) - len(scratch_ids))


def measure_record_drift(
    record: LedgerRecord, message_dicts: Sequence[dict[str, Any]], renderer: Any
) -> tuple[int, int]:
    """(drift_tokens, drifted_turns) over every extended turn on ``record``'s chain.

    For each turn we render its message prefix from scratch and compare with the ledger's prompt
    ids. A turn that fell back to a full render is drifted by definition; its drift is measured
    against the token-exact history it could not extend. The prefixes share their pieces between
    special tokens, so each piece is tokenized once per measurement (``memo``), not once per turn.
    """
    drift_tokens = 0
    drifted_turns = 0
    memo: dict[str, list[int]] = {}
    current: LedgerRecord | None = record
    while current is not None and current.parent is not None:
        prefix = message_dicts[: current.num_prompt_messages]
        scratch = renderer.render_ids_shared(prefix, current.tools, memo)
        if current.restart:
            history = current.parent.history_ids()
            tokens = count_drift(history, scratch[: len(history)])
        else:
            prompt = current.prompt_ids()
            tokens = count_drift(prompt[: len(prompt) - current.prefilled], scratch)
        drift_tokens += tokens
        drifted_turns += 1 if (tokens or current.drifted) else 0
        current = current.parent
    return drift_tokens, drifted_turns
