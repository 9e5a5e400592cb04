"""Bounding an await by a deadline, cheaply enough to do it several times per model call.

Every model call, every engine request and every async environment hook runs under a deadline, so
at 10,000 concurrent rollouts tens of thousands are armed at once. ``asyncio.timeout`` arms one loop
timer each (a heap push, and a Python-level comparison per heap level, ~5 us with that many timers
live) and runs a state machine on top; ``asyncio.wait_for`` (3.11) starts a whole task. Here the
deadlines of one loop are grouped by the 10 ms tick they fall in and share one loop timer per tick,
so arming one is a set insertion. The price is precision: a deadline fires up to 10 ms late.

Semantics are ``asyncio.timeout``'s: when the deadline passes the task is cancelled, and the
``CancelledError`` that ends the block becomes ``TimeoutError``, unless someone else cancelled the
task as well (then the cancellation goes on).
"""

from __future__ import annotations

import asyncio
import math
import weakref
from typing import Any

RESOLUTION_S = 0.01


class _Ticks:
    """One loop's live deadlines by tick: a tick's timer expires whatever is still in its bucket, and
    is cancelled as soon as its bucket empties, so blocks that finish in time leave nothing behind.

    It never holds its loop: it is the value of a weak dictionary keyed by that loop, and a strong
    reference from value to key would keep every finished loop (one per ``asyncio.run``) alive."""

    def __init__(self) -> None:
        self._buckets: dict[int, tuple[set[Deadline], asyncio.TimerHandle]] = {}

    def add(self, deadline: Deadline, loop: asyncio.AbstractEventLoop, when: float) -> int:
        tick = math.ceil(when / RESOLUTION_S)
        entry = self._buckets.get(tick)
        if entry is None:
            entry = self._buckets[tick] = (set(), loop.call_at(tick * RESOLUTION_S, self._fire, tick))
        entry[0].add(deadline)
        return tick

    def remove(self, deadline: Deadline, tick: int) -> None:
        entry = self._buckets.get(tick)
        if entry is not None:
            entry[0].discard(deadline)
            if not entry[0]:
                del self._buckets[tick]
                entry[1].cancel()

    def _fire(self, tick: int) -> None:
        bucket, _ = self._buckets.pop(tick, ((), None))
        for deadline in bucket:
            deadline.expire()


_TICKS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Ticks] = weakref.WeakKeyDictionary()


def _ticks(loop: asyncio.AbstractEventLoop) -> _Ticks:
    ticks = _TICKS.get(loop)
    if ticks is None:
        ticks = _TICKS[loop] = _Ticks()
    return ticks


class Deadline:
    """``with Deadline(seconds):`` bounds the awaits inside the block (``None``: no bound)."""

    __slots__ = ("_cancelling", "_seconds", "_task", "_tick", "_ticks", "expired")

    def __init__(self, seconds: float | None) -> None:
        if seconds is not None and math.isnan(seconds):
            raise ValueError("a deadline needs a number of seconds or None, not NaN.")
        self._seconds = None if seconds is not None and math.isinf(seconds) and seconds > 0 else seconds
        self._ticks: _Ticks | None = None
        self._tick = 0
        self.expired = False

    def __enter__(self) -> Deadline:
        if self._seconds is not None:
            task = asyncio.current_task()
            if task is None:
                raise RuntimeError("Deadline must be used inside an asyncio task.")
            self._task, self._cancelling = task, task.cancelling()
            loop = asyncio.get_running_loop()
            self._ticks = _ticks(loop)
            self._tick = self._ticks.add(self, loop, loop.time() + self._seconds)
        return self

    def expire(self) -> None:
        """Called by the tick's timer: cancel the task (the block is still running: it is in the bucket)."""
        self.expired = True
        self._task.cancel()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if self._ticks is None:
            return
        self._ticks.remove(self, self._tick)
        if self.expired and self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
            raise TimeoutError(f"no result within {self._seconds} s") from exc
