"""Every call into user code (environment hooks, stop conditions, rewards, tools) goes through here, bounded.

Invariant: a user function that never returns costs one rollout, never the run, and never keeps
the process alive. Three cases, three mechanisms:

- Async code is awaited under ``asyncio.timeout``.
- Sync environment hooks (``setup_state``, ``env_response``, stop conditions) run on the event
  loop's own thread, as they always have: environments written for verifiers assume no two of them
  overlap, and a stop condition is checked several times a turn, where a thread hop would cost
  ~250 us under load (10,000 concurrent rollouts took 32 s instead of 15 s). ``run_inline`` bounds
  them with a watchdog thread that raises ``HookInterrupted`` (a BaseException, so a user's
  ``except Exception`` cannot swallow it) inside the loop thread once the deadline passes, once per
  call, so an interruption that lands just as the hook returns can never repeat into unrelated
  code. Limits: a hook blocked inside one C call (a socket read with no timeout, ``Event.wait()``)
  is interrupted only when that call returns, and a bare ``except:`` in the hook can swallow the
  interruption; blocking I/O belongs in an async hook or behind its own timeout.
- Sync rewards and tools run on a daemon thread from a pool this module owns (they may block on I/O,
  and a group's rewards run in parallel). ``concurrent.futures`` joins its threads at interpreter
  exit and ``asyncio.run`` joins the default executor, so one thread stuck there hangs the process
  after its work is done; a daemon thread dies with the interpreter. A call that outlives its
  timeout is abandoned, and a fresh thread takes its place, so hung calls never starve the rest.
  The timeout of a pooled call starts when a thread picks it up.
- A sync reward that has proven cheap (``CallCost``: its first calls on the pool each took under a
  millisecond) is called inline after that, under the watchdog like a hook, because the thread hop
  cost the loop more than the function did; one slow inline call sends it back to the pool.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import ctypes
import functools
import inspect
import itertools
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from bridges.runtime.deadlines import Deadline


class UserCodeTimeout(TimeoutError):
    """A user function did not return within its bound; the message says which and how long."""


class HookInterrupted(BaseException):
    """Raised inside a sync hook that ran past its deadline (by the watchdog, never by user code)."""


WATCHDOG_POLL_S = 0.1


class InlineWatchdog:
    """Interrupts sync code that runs past its deadline on the thread that called ``run``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._armed: dict[int, tuple[int, float]] = {}  # thread id -> (token, deadline)
        self._fired: set[int] = set()  # tokens interrupted at least once
        self._tokens = itertools.count()
        self._thread: threading.Thread | None = None

    def run(self, func: Callable[..., Any], args: tuple[Any, ...], timeout: float | None, what: str) -> Any:
        if timeout is None:
            return func(*args)
        token = self._arm(timeout)
        try:
            try:
                return func(*args)
            finally:  # a hook that returned right at its deadline keeps its result
                self._disarm(token)
        except HookInterrupted:  # in the hook, or in the few bytecodes between its return and _disarm
            raise UserCodeTimeout(f"{what} did not finish within {timeout} s.") from None

    def _arm(self, timeout: float) -> int:
        token = next(self._tokens)
        tid = threading.get_ident()
        with self._lock:
            stale = self._armed.get(tid)
            if stale is not None:  # a previous call interrupted before it could disarm
                self._fired.discard(stale[0])
            self._armed[tid] = (token, time.monotonic() + timeout)
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="bridges-hook-watchdog", daemon=True)
                self._thread.start()
        return token

    def _disarm(self, token: int) -> None:
        """Stop watching; clear an interruption fired but not yet delivered. Retried until it completes,
        since the interruption itself may land while this runs."""
        while True:
            try:
                with self._lock:
                    tid = threading.get_ident()
                    if self._armed.get(tid, (None,))[0] == token:
                        del self._armed[tid]
                    if token in self._fired:
                        self._fired.discard(token)
                        _set_async_exc(tid, None)
                    return
            except HookInterrupted:
                continue

    def _watch(self) -> None:
        while True:
            time.sleep(WATCHDOG_POLL_S)
            now = time.monotonic()
            with self._lock:
                for tid, (token, deadline) in self._armed.items():
                    if now >= deadline and token not in self._fired:
                        self._fired.add(token)
                        _set_async_exc(tid, HookInterrupted)


def _set_async_exc(thread_id: int, exc: type[BaseException] | None) -> None:
    """Raise ``exc`` in another thread at its next bytecode (None: clear one not yet raised)."""
    value = ctypes.py_object(exc) if exc is not None else None
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), value)


WATCHDOG = InlineWatchdog()


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

    @property
    def threads_running(self) -> int:
        """Threads inside a call now, abandoned ones included (a process should not exit under them:
        a C++ call finishing during interpreter shutdown can abort it)."""
        with self._lock:
            return self._live - self._idle + len(self._abandoned)


WORKERS = DaemonPool(32, "bridges-user")  # sync rewards and tools


CHEAP_CALL_S = 0.001  # a pooled call that ran under this counts towards proving a function cheap
PROVEN_AFTER = 8  # this many cheap pooled calls in a row and the function runs inline
SLOW_INLINE_S = 0.005  # one inline call over this and the function goes back to the pool for good


class CallCost:
    """Whether a sync user function has proven cheap enough to run on the loop's own thread.

    A hop to a worker thread costs the event loop ~60 us of CPU under load (a queue put, a thread
    wake-up, the GIL hand-over and a wake-up back), more than a typical reward function's own work,
    and a 3-turn rollout scored by two rewards pays it twice. A function whose first
    ``PROVEN_AFTER`` pooled calls each ran under ``CHEAP_CALL_S`` is called inline after that,
    under the same watchdog as the environment's sync hooks; one inline call over ``SLOW_INLINE_S``
    (a cache miss that went to the network) sends it back to the pool for good. The bound holds
    inline for Python code; a call blocked inside one C call (a socket read with no timeout) is
    interrupted only when that call returns, so a function that can block that way should be async.
    """

    __slots__ = ("cheap_calls", "slow")

    def __init__(self) -> None:
        self.cheap_calls = 0
        self.slow = False

    @property
    def inline(self) -> bool:
        return not self.slow and self.cheap_calls >= PROVEN_AFTER

    def observe(self, seconds: float, inline: bool) -> None:
        """Record one call's run time (a lost increment from two threads only delays promotion)."""
        if seconds > (SLOW_INLINE_S if inline else CHEAP_CALL_S):
            self.slow = True
        elif not inline:
            self.cheap_calls += 1


async def call_user(
    func: Callable[..., Any],
    /,
    *args: Any,
    timeout: float | None,
    what: str,
    inline: bool = False,
    cost: CallCost | None = None,
    pool: DaemonPool = WORKERS,
    **kwargs: Any,
) -> Any:
    """``func(*args, **kwargs)`` bounded by ``timeout`` seconds (None: unbounded).

    Async functions are awaited; sync ones run on the loop's thread under the watchdog (``inline``,
    for environment hooks, or once ``cost`` says the function is cheap) or on the daemon pool. A
    coroutine returned by a sync wrapper is awaited under the same bound. Raises
    ``UserCodeTimeout`` naming ``what`` on a timeout.
    """
    target = getattr(func, "func", func)  # functools.partial
    if inspect.iscoroutinefunction(target) or inspect.iscoroutinefunction(getattr(target, "__call__", None)):  # noqa: B004
        result = func(*args, **kwargs)
    elif inline or (cost is not None and cost.inline):
        started = time.perf_counter()
        try:
            result = WATCHDOG.run(functools.partial(func, **kwargs) if kwargs else func, args, timeout, what)
        finally:
            if cost is not None and not inline:  # a hook's own cost is not tracked
                cost.observe(time.perf_counter() - started, True)
    else:
        result = await _in_thread(func, args, kwargs, timeout, what, pool, cost)
    if inspect.isawaitable(result):
        try:
            with Deadline(timeout):
                result = await result
        except TimeoutError:
            raise UserCodeTimeout(f"{what} did not finish within {timeout} s.") from None
    return result


def _deliver(waiter: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if not waiter.done():  # the caller may have timed out or been cancelled meanwhile
        if ok:
            waiter.set_result(value)
        else:
            waiter.set_exception(value)


async def _in_thread(
    func: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    timeout: float | None,
    what: str,
    pool: DaemonPool,
    cost: CallCost | None,
) -> Any:
    """One wake-up of the loop per call (the result's), and one timer that starts counting when a
    thread picks the call up: half the loop's CPU of ``wrap_future`` + an event + ``asyncio.wait``."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()
    picked_up: list[float] = []

    def run() -> None:
        picked_up.append(time.monotonic())
        try:
            value, ok = context.run(func, *args, **kwargs), True
        except BaseException as exc:  # handed to the awaiting caller
            value, ok = exc, False
        if cost is not None:
            cost.observe(time.monotonic() - picked_up[0], False)
        with contextlib.suppress(RuntimeError):  # the loop closed while the call ran: nobody waits
            loop.call_soon_threadsafe(_deliver, waiter, ok, value)

    future = pool.submit(run)
    if timeout is None:
        return await waiter

    timers: list[asyncio.TimerHandle] = []  # the bound's timer, re-armed while the call waits for a thread

    def check() -> None:
        if waiter.done():
            return
        left = timeout if not picked_up else picked_up[0] + timeout - time.monotonic()
        if left > 0:  # not picked up yet (the bound starts then), or picked up less than timeout ago
            timers.append(loop.call_later(left, check))
            return
        pool.abandon(future)
        waiter.set_exception(UserCodeTimeout(f"{what} did not finish within {timeout} s."))

    timers.append(loop.call_later(timeout, check))
    try:
        return await waiter
    finally:
        for timer in timers:
            timer.cancel()
        future.cancel()  # a call not yet picked up is dropped; a running one finishes unobserved
