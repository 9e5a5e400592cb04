"""Rollout states as JSON-safe records, and back.

Records go to JSONL files and ``datasets.Dataset`` tables, where every row must share one schema:
single-turn, multi-turn and tool-calling rows are mixed in one table. So every message record has
the same keys (absent ones are ``None``), and the free-form parts (``info``, extra dataset columns,
environment extras) are JSON strings rather than structs whose fields Arrow would have to unify.
"""

from __future__ import annotations

import json
import math
from typing import Any

from bridges.envs.messages import to_message_dict
from bridges.envs.types import State, Timing, Turn

MESSAGE_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name", "reasoning_content")


def _json_default(obj: Any) -> Any:
    dump = getattr(obj, "model_dump", None)
    if callable(dump):
        return dump()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    return str(obj)


def dumps(obj: Any) -> str:
    """JSON text for anything a state may hold (unknown objects become their ``str``)."""
    return json.dumps(obj, default=_json_default, ensure_ascii=False)


def message_record(message: Any) -> dict[str, Any]:
    """A message with every key of ``MESSAGE_KEYS`` present (``None`` where absent)."""
    m = to_message_dict(message)
    return {key: m.get(key) for key in MESSAGE_KEYS}


def _message_from_record(record: dict[str, Any]) -> dict[str, Any]:
    return to_message_dict({k: v for k, v in record.items() if v is not None or k == "content"})


def _finite(x: float | None) -> float | None:
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x


def state_to_record(state: State) -> dict[str, Any]:
    """One JSON-safe row per rollout, with the token ids and logprobs of every turn."""
    return {
        "example_id": state.example_id,
        "task": state.task,
        "prompt": [message_record(m) for m in state.prompt],
        "completion": [message_record(m) for m in state.completion],
        "answer": state.answer,
        "info": dumps(state.info),
        "row": dumps(state.row),
        "turns": [
            {
                "prompt_ids": list(t.prompt_ids),
                "completion_ids": list(t.completion_ids),
                "logprobs": [float(x) for x in t.logprobs],
                "finish_reason": t.finish_reason,
                "weight_version": t.weight_version,
                "message": message_record(t.message) if t.message else None,
            }
            for t in state.turns
        ],
        "reward": _finite(state.reward),
        "metrics": {k: float(v) for k, v in state.metrics.items()},
        "stop_reason": state.stop_reason,
        "error": state.error,
        "timing": state.timing.model_dump(),
        "drift_tokens": state.drift_tokens,
        "drifted_turns": state.drifted_turns,
        "extras": dumps(state.extras),
    }


def _loads(value: Any) -> Any:
    if isinstance(value, str):
        return json.loads(value) if value else {}
    return value if value is not None else {}


def record_to_state(record: dict[str, Any]) -> State:
    """Rebuild a ``State`` from ``state_to_record`` output (also after a trip through a Dataset)."""
    turns = [
        Turn(
            prompt_ids=list(t.get("prompt_ids") or []),
            completion_ids=list(t.get("completion_ids") or []),
            logprobs=list(t.get("logprobs") or []),
            finish_reason=t.get("finish_reason"),
            weight_version=t.get("weight_version"),
            message=_message_from_record(t["message"]) if t.get("message") else {},
        )
        for t in record.get("turns") or []
    ]
    metrics = {k: float(v) for k, v in (record.get("metrics") or {}).items() if v is not None}
    return State(
        example_id=int(record.get("example_id") or 0),
        task=record.get("task") or "default",
        prompt=[_message_from_record(m) for m in record.get("prompt") or []],
        completion=[_message_from_record(m) for m in record.get("completion") or []],
        answer=record.get("answer") or "",
        info=_loads(record.get("info")),
        row=_loads(record.get("row")),
        turns=turns,
        reward=record.get("reward"),
        metrics=metrics,
        stop_reason=record.get("stop_reason"),
        error=record.get("error"),
        timing=Timing(**(record.get("timing") or {})),
        drift_tokens=record.get("drift_tokens"),
        drifted_turns=record.get("drifted_turns"),
        extras=_loads(record.get("extras")),
    )
