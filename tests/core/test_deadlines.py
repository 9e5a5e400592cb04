"""Deadline: asyncio.timeout's semantics with deadlines grouped into 10 ms ticks."""

from __future__ import annotations

import asyncio
import time

import pytest

from bridges.runtime.deadlines import RESOLUTION_S, Deadline


async def test_a_deadline_cancels_the_block_and_raises_timeout_error_soon_after_it_passes():
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="no result within 0.05 s"), Deadline(0.05):
        await asyncio.sleep(10)
    elapsed = time.monotonic() - started
    assert 0.05 <= elapsed < 0.05 + RESOLUTION_S + 0.2  # late by at most a tick (plus a busy machine)
    assert asyncio.current_task().cancelling() == 0  # nothing left pending on the task


async def test_a_block_that_finishes_in_time_is_never_cancelled_later():
    with Deadline(0.02) as deadline:
        await asyncio.sleep(0)
    await asyncio.sleep(0.06)  # well past the deadline: the tick's timer finds the block gone
    assert not deadline.expired
    assert asyncio.current_task().cancelling() == 0
    with Deadline(None):  # no bound
        await asyncio.sleep(0.01)


async def test_many_deadlines_in_one_tick_expire_only_the_blocks_still_running():
    async def block(seconds: float) -> str:
        try:
            with Deadline(0.05):
                await asyncio.sleep(seconds)
            return "done"
        except TimeoutError:
            return "timeout"

    results = await asyncio.gather(*(block(0.0 if i % 2 else 5.0) for i in range(200)))
    assert results == ["done" if i % 2 else "timeout" for i in range(200)]


async def test_a_cancellation_from_outside_stays_a_cancellation():
    async def waits() -> None:
        with Deadline(0.05):
            await asyncio.sleep(10)

    task = asyncio.ensure_future(waits())
    await asyncio.sleep(0.01)
    task.cancel()  # before the deadline: the caller cancelled, not the deadline
    with pytest.raises(asyncio.CancelledError):
        await task

    deadlines: list[Deadline] = []

    async def both() -> None:
        with Deadline(10.0) as deadline:
            deadlines.append(deadline)
            await asyncio.sleep(10)

    task = asyncio.ensure_future(both())
    await asyncio.sleep(0)  # the task is inside its block now
    deadlines[0].expire()  # the deadline fires and the caller cancels before the task runs again:
    task.cancel()  # the cancellation wins, as with asyncio.timeout
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_nested_deadlines_the_inner_one_fires_and_the_outer_block_goes_on():
    with Deadline(5.0) as outer:
        with pytest.raises(TimeoutError), Deadline(0.02):
            await asyncio.sleep(10)
        await asyncio.sleep(0.01)  # still inside the outer block, not cancelled
    assert not outer.expired


def test_a_deadline_outside_a_task_is_refused():
    with pytest.raises(RuntimeError), Deadline(1.0):
        pass


async def test_an_infinite_deadline_is_no_bound_and_nan_is_refused():
    with Deadline(float("inf")) as deadline:
        await asyncio.sleep(0.01)
    assert not deadline.expired
    with pytest.raises(ValueError, match="not NaN"):
        Deadline(float("nan"))
    # zero or less: expires at the next tick, like asyncio.timeout(0)
    with pytest.raises(TimeoutError), Deadline(0):
        await asyncio.sleep(1)


def test_finished_loops_and_finished_blocks_leave_nothing_behind():
    import gc
    import weakref

    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def block() -> int:
        with Deadline(60.0):
            await asyncio.sleep(0)
        loop = asyncio.get_running_loop()
        loops.append(weakref.ref(loop))
        return sum(1 for h in loop._scheduled if not h.cancelled())  # no live tick timer is left

    assert [asyncio.run(block()) for _ in range(3)] == [0, 0, 0]
    gc.collect()
    assert [ref() for ref in loops] == [None, None, None]  # the ticks' weak map kept no loop alive
