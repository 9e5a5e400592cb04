"""Small asyncio helpers shared by environments and rubrics.

``asyncio.Semaphore`` binds itself to the first event loop that contends for it, and the ``*_sync``
entry points start a fresh loop per call; a semaphore that silently survives into the next loop
raises "bound to a different event loop". ``LoopSemaphore`` keeps one semaphore per running loop.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


async def maybe_await(value: Any) -> Any:
    """Await ``value`` if it is awaitable, so hooks may be written sync or async."""
    if inspect.isawaitable(value):
        return await value
    return value


class LoopSemaphore:
    """A semaphore with a fixed capacity, re-created for each event loop it is used in."""

    def __init__(self, value: int) -> None:
        if value < 1:
            raise ValueError(f"a concurrency limit must be at least 1, got {value}.")
        self.value = value
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sem: asyncio.Semaphore | None = None

    def get(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._sem is None or self._loop is not loop:
            self._loop, self._sem = loop, asyncio.Semaphore(self.value)
        return self._sem

    async def __aenter__(self) -> None:
        await self.get().acquire()

    async def __aexit__(self, *exc: object) -> None:
        self.get().release()


def backoff_delay(attempt: int, base: float, cap: float) -> float:
    """Exponential backoff: base, 2*base, 4*base, ... capped at ``cap`` seconds."""
    return min(cap, base * (2**attempt))


def describe_exception(exc: BaseException) -> str:
    """``Type: text`` on one line, the form every recorded error uses."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion from sync code: on a fresh loop, or, when this thread already runs
    one (a notebook, a trainer's callback), on a helper thread with its own loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(coro)
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="bridges-sync-run")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]
