"""Every call into user code (environment hooks, stop conditions, rewards, tools) goes through here, bounded.

Invariant: a user function that never returns costs one rollout, never the run, and never keeps
the process alive. Async code is bounded with ``asyncio.wait_for``. Sync code runs on a daemon
thread from a pool this module owns, because the other pools cannot give that guarantee:
``concurrent.futures`` joins its worker threads at interpreter exit and ``asyncio.run`` joins the
default executor when it closes the loop, so one thread stuck in a ``while True`` there hangs the
process after its work is done (the summary and dataset of an evaluation are never written). A
daemon thread dies with the interpreter. A call that outlives its timeout is abandoned: its thread
leaves the pool when (if ever) the call returns, and a fresh thread takes its place, so hung calls
never starve the calls behind them.

The timeout of a sync call starts when a thread picks it up, so queueing behind a busy pool never
counts against a function.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import inspect
import queue
import threading
from collections.abc import Callable
from typing import Any


class UserCodeTimeout(TimeoutError):
    """A user function did not return within its bound; the message says which and how long."""


class DaemonPool:
    """A thread pool of daemon threads that replaces a thread abandoned to a hung call."""

    def __init__(self, max_workers: int, name: str) -> None:
        self.max_workers = max_workers
        self.name = name
        self._queue: queue.SimpleQueue[tuple[concurrent.futures.Future[Any], Callable[[], Any]]] = (
            queue.SimpleQueue()
        )
        self._lock = threading.Lock()
        self._idle = 0  # threads not running a call (waiting for one, or just started)
        self._pending = 0  # calls queued and not yet taken by a thread
        self._live = 0  # threads counted against max_workers (abandoned ones are not)
        self._abandoned: set[int] = set()
        self._spawned = 0

    def submit(self, call: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._lock:
            self._pending += 1
            if self._pending > self._idle and self._live < self.max_workers:
                self._spawn()
        self._queue.put((future, call))
        return future

    def abandon(self, future: concurrent.futures.Future[Any]) -> None:
        """The caller gave up on ``future`` while it runs: its thread stops counting, a new one may start."""
        with self._lock:
            if future.done() or id(future) in self._abandoned:
                return
            self._abandoned.add(id(future))
            self._live -= 1
            if self._pending > self._idle:
                self._spawn()

    def _spawn(self) -> None:
        self._live += 1
        self._idle += 1
        self._spawned += 1
        thread = threading.Thread(target=self._work, name=f"{self.name}-{self._spawned}", daemon=True)
        thread.start()

    def _work(self) -> None:
        while True:
            future, call = self._queue.get()
            with self._lock:
                self._pending -= 1
                self._idle -= 1
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(call())
                except BaseException as exc:  # handed to the awaiting caller
                    future.set_exception(exc)
            with self._lock:
                if id(future) in self._abandoned:  # this thread was replaced while it was stuck
                    self._abandoned.discard(id(future))
                    return
                self._idle += 1

    @property
    def threads_abandoned(self) -> int:
        with self._lock:
            return len(self._abandoned)


# Sync environment hooks run one at a time, as they did on the event loop (user code written for
# verifiers assumes no two env_response calls overlap); rewards and tools run in parallel.
HOOKS = DaemonPool(1, "bridges-hook")
WORKERS = DaemonPool(32, "bridges-user")


async def call_user(
    func: Callable[..., Any],
    /,
    *args: Any,
    timeout: float | None,
    what: str,
    pool: DaemonPool = WORKERS,
    **kwargs: Any,
) -> Any:
    """``func(*args, **kwargs)`` bounded by ``timeout`` seconds (None: unbounded).

    Async functions are awaited; sync ones run on ``pool``. A coroutine returned by a sync wrapper is
    awaited under the same bound. Raises ``UserCodeTimeout`` naming ``what`` on a timeout.
    """
    target = getattr(func, "func", func)  # functools.partial
    if inspect.iscoroutinefunction(target) or inspect.iscoroutinefunction(getattr(target, "__call__", None)):  # noqa: B004
        result = func(*args, **kwargs)
    else:
        result = await _in_thread(func, args, kwargs, timeout, what, pool)
    if inspect.isawaitable(result):
        try:
            result = await asyncio.wait_for(result, timeout)
        except TimeoutError:
            raise UserCodeTimeout(f"{what} did not finish within {timeout} s.") from None
    return result


async def _in_thread(
    func: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    timeout: float | None,
    what: str,
    pool: DaemonPool,
) -> Any:
    loop = asyncio.get_running_loop()
    started = asyncio.Event()
    context = contextvars.copy_context()

    def run() -> Any:
        loop.call_soon_threadsafe(started.set)
        return context.run(func, *args, **kwargs)

    future = pool.submit(run)
    waiting = asyncio.wrap_future(future)
    if timeout is None:
        return await waiting
    waiter = asyncio.ensure_future(started.wait())
    try:
        await asyncio.wait({waiting, waiter}, return_when=asyncio.FIRST_COMPLETED)
        await asyncio.wait({waiting}, timeout=timeout)
    finally:
        waiter.cancel()
    if not waiting.done():
        pool.abandon(future)
        waiting.cancel()
        raise UserCodeTimeout(f"{what} did not finish within {timeout} s.")
    return waiting.result()
