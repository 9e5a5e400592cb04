"""Recording what an ``EngineClient`` answered, for code in this process that calls it through layers
which drop the token-id extras on the way back (verifiers' client wrappers)."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

RESPONSE_SINK: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar("bridges_responses", default=None)


@contextlib.contextmanager
def recording_responses() -> Iterator[list[Any]]:
    """Collect every chat completion an ``EngineClient`` returns inside this context (and tasks it starts).

    For code that calls the client through layers that drop the token-id extras on the way back
    (verifiers' client wrappers): the recorded responses still carry them. It is a session's record
    for code in this process (the legacy verifiers adapter uses it): code in another process, or
    code that is handed a URL rather than a client object, gets a per-rollout session instead
    (``bridges.agents``). Routing in-process code through a session would add an HTTP round trip
    per call (about 6 ms against 0.2 ms: ``benchmarks/agent_sessions.py``) to reach the same record.
    """
    sink: list[Any] = []
    token = RESPONSE_SINK.set(sink)
    try:
        yield sink
    finally:
        RESPONSE_SINK.reset(token)
