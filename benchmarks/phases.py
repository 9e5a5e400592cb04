"""Where a model call's CPU goes: exclusive time per phase, measured by wrapping the functions of each phase.

Used by ``rollout_scale.py --phases`` (an extra, instrumented wave after the timed ones, so the
wrappers never touch the reported figures). Time is the process's CPU time, like the total it is
compared with, so other jobs on a shared machine do not inflate a phase. Sync functions are timed around the call; async ones
around every step of their coroutine (each ``send`` into it), so time a coroutine spends suspended
is never counted. Phases nest: a render inside the drift measurement is counted as render, not as
drift. Time inside Python's garbage collector (``gc.callbacks``) is taken out of whichever phase it
interrupted and counted as its own phase. What no phase claims is the event loop and task
machinery, the environment loop's own glue and the instrumentation itself.

The functions are found by name; one that a version of the library lacks is skipped, so the same
script measures an older checkout (``PYTHONPATH=<old checkout> python benchmarks/rollout_scale.py``).
"""

from __future__ import annotations

import functools
import gc
import importlib
import inspect
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from typing import Any

# phase -> "module:Owner.attribute" (or "module:function") of the code it covers
PHASES: dict[str, tuple[str, ...]] = {
    "render (jinja)": ("bridges.client.rendering:ChatRenderer.render_text",),
    "tokenizer": (
        "bridges.client.segments:SegmentEncoder.encode_one",
        "bridges.client.rendering:ChatRenderer.decode",
    ),
    "ledger": (
        "bridges.client.engine_client:prefix_hashes",
        "bridges.client.engine_client:extend_hash",
        "bridges.client.ledger:TokenLedger.longest_prefix",
        "bridges.client.ledger:TokenLedger.put",
        "bridges.client.ledger:LedgerRecord.history_ids",
        "bridges.client.ledger:LedgerRecord.prompt_ids",
    ),
    "drift measurement (own)": ("bridges.client.engine_client:measure_record_drift",),
    "responses (pydantic)": (
        "bridges.client.engine_client:validate_with_ids",
        "bridges.envs.multiturn:turn_from_response",
    ),
    "client (own)": (  # _chat_create itself is bound when a client is made: its glue counts as the loop's
        "bridges.client.engine_client:parse_chat",
        "bridges.client.engine_client:EngineClient._chat_payload",
        "bridges.client.engine_client:EngineClient._generate",
    ),
    "environment hooks": ("bridges.envs.multiturn:MultiTurnEnv._hook",),
    "scoring": ("bridges.envs.rubric:Rubric.score_group",),
    "environment loop (own)": (
        "bridges.envs.multiturn:MultiTurnEnv.rollout",
        "bridges.envs.base:Environment._bounded_rollout",
    ),
}


class PhaseTimer:
    """Exclusive seconds per phase; ``stack`` holds [phase, started, seconds of nested phases]."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {name: 0.0 for name in PHASES}
        self.seconds["garbage collector"] = 0.0
        self.stack: list[list[Any]] = []
        self._gc_started = 0.0

    def enter(self, phase: str) -> None:
        self.stack.append([phase, time.process_time(), 0.0])

    def leave(self) -> None:
        phase, started, nested = self.stack.pop()
        elapsed = time.process_time() - started
        self.seconds[phase] += elapsed - nested
        if self.stack:
            self.stack[-1][2] += elapsed

    def on_gc(self, event: str, info: dict[str, Any]) -> None:
        if event == "start":
            self._gc_started = time.process_time()
            return
        elapsed = time.process_time() - self._gc_started
        self.seconds["garbage collector"] += elapsed
        if self.stack:
            self.stack[-1][2] += elapsed

    def timed_sync(self, phase: str, func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            self.enter(phase)
            try:
                return func(*args, **kwargs)
            finally:
                self.leave()

        return wrapper

    def timed_async(self, phase: str, func: Callable[..., Any]) -> Callable[..., Any]:
        timer = self

        class Stepped:
            def __init__(self, coro: Any) -> None:
                self.coro = coro

            def __await__(self) -> Generator[Any, Any, Any]:
                gen = self.coro.__await__()
                step, value = gen.send, None
                while True:
                    timer.enter(phase)
                    try:
                        yielded = step(value)
                    except StopIteration as stop:
                        return stop.value
                    finally:
                        timer.leave()
                    try:
                        value, step = (yield yielded), gen.send
                    except BaseException as exc:  # thrown in by the task (a cancellation): pass it on
                        value, step = exc, gen.throw

        @functools.wraps(func)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            return await Stepped(func(*args, **kwargs))

        return wrapper


def _resolve(target: str) -> tuple[Any, str] | None:
    module_name, _, path = target.partition(":")
    owner: Any = importlib.import_module(module_name)
    *parents, name = path.split(".")
    for parent in parents:
        owner = getattr(owner, parent, None)
    if owner is None or not hasattr(owner, name):
        return None
    return owner, name


@contextmanager
def instrumented() -> Iterator[PhaseTimer]:
    """Wrap every phase's functions for the block; restore them (and gc.callbacks) after."""
    timer = PhaseTimer()
    saved: list[tuple[Any, str, Any]] = []
    for phase, targets in PHASES.items():
        for target in targets:
            found = _resolve(target)
            if found is None:
                continue
            owner, name = found
            original = inspect.getattr_static(owner, name)
            func = getattr(owner, name)
            wrap = timer.timed_async if inspect.iscoroutinefunction(func) else timer.timed_sync
            setattr(owner, name, wrap(phase, original))
            saved.append((owner, name, original))
    gc.callbacks.append(timer.on_gc)
    try:
        yield timer
    finally:
        gc.callbacks.remove(timer.on_gc)
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)


def report(timer: PhaseTimer, cpu_seconds: float, calls: int) -> list[str]:
    """Lines of ``phase  us/call  share``; the rest is what no phase claimed."""
    per_call = {name: seconds / calls * 1e6 for name, seconds in timer.seconds.items()}
    total = cpu_seconds / calls * 1e6
    per_call["event loop, tasks and the rest"] = total - sum(per_call.values())
    lines = [f"  {name:<32} {us:7.1f} us  {us / total:6.1%}" for name, us in per_call.items()]
    return [*lines, f"  {'total (CPU per model call)':<32} {total:7.1f} us"]
