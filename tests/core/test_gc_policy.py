"""relaxed_gc: raised while any rollout batch runs (nested, concurrent), the caller's setting restored."""

from __future__ import annotations

import asyncio
import gc

from bridges.runtime.gc_policy import (
    OBJECTS_PER_ROLLOUT,
    OLDER_GENERATIONS_THRESHOLD,
    ROLLOUT_GC_THRESHOLD,
    relaxed_gc,
)


def test_threshold_raised_inside_and_restored_after_nesting():
    saved = gc.get_threshold()
    gc.set_threshold(700, 11, 12)
    try:
        with relaxed_gc():
            older = OLDER_GENERATIONS_THRESHOLD
            assert gc.get_threshold() == (ROLLOUT_GC_THRESHOLD, older, 12)  # generation 2: the caller's
            with relaxed_gc():
                assert gc.get_threshold()[0] == ROLLOUT_GC_THRESHOLD
            assert gc.get_threshold()[0] == ROLLOUT_GC_THRESHOLD  # the outer batch still runs
        assert gc.get_threshold() == (700, 11, 12)
        gc.set_threshold(0, 10, 10)  # a caller who disabled automatic collection keeps it disabled
        with relaxed_gc():
            assert gc.get_threshold()[0] == 0
        gc.set_threshold(2_000_000, 10, 5_000)  # and one who set higher thresholds keeps theirs
        with relaxed_gc():
            assert gc.get_threshold() == (2_000_000, OLDER_GENERATIONS_THRESHOLD, 5_000)
        gc.set_threshold(2_000_000, 500, 10)
        with relaxed_gc():
            assert gc.get_threshold() == (2_000_000, 500, 10)
    finally:
        gc.set_threshold(*saved)


def test_a_large_batch_raises_the_young_threshold_with_its_size():
    """A batch's own live objects (a few hundred a rollout) must not trip young collections that free
    nothing: the threshold grows with the batch; a smaller batch inside it never lowers it."""
    saved = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    try:
        with relaxed_gc(rollouts=100):  # 100 rollouts: the fixed floor is higher
            assert gc.get_threshold()[0] == ROLLOUT_GC_THRESHOLD
        with relaxed_gc(rollouts=10_000):
            assert gc.get_threshold() == (OBJECTS_PER_ROLLOUT * 10_000, OLDER_GENERATIONS_THRESHOLD, 10)
            with relaxed_gc(rollouts=64):
                assert gc.get_threshold()[0] == OBJECTS_PER_ROLLOUT * 10_000
            with relaxed_gc(rollouts=20_000):  # a larger batch starting alongside raises it further
                assert gc.get_threshold()[0] == OBJECTS_PER_ROLLOUT * 20_000
        assert gc.get_threshold() == (700, 10, 10)
        gc.set_threshold(0, 10, 10)
        with relaxed_gc(rollouts=10_000):  # disabled stays disabled
            assert gc.get_threshold()[0] == 0
    finally:
        gc.set_threshold(*saved)


def test_restored_when_the_block_raises_and_across_concurrent_batches():
    saved = gc.get_threshold()

    async def batch(seconds: float) -> tuple[int, int, int]:
        with relaxed_gc():
            await asyncio.sleep(seconds)
            return gc.get_threshold()

    async def both() -> list[tuple[int, int, int]]:
        return list(await asyncio.gather(batch(0.01), batch(0.03)))

    assert [t[0] for t in asyncio.run(both())] == [ROLLOUT_GC_THRESHOLD] * 2
    assert gc.get_threshold() == saved
    try:
        with relaxed_gc():
            raise KeyError("x")
    except KeyError:
        pass
    assert gc.get_threshold() == saved


def test_a_cycle_that_outlives_a_young_collection_is_still_reclaimed_while_a_batch_runs():
    """A trainer that generates ahead keeps a batch in flight for its whole run: the older
    generations must still be collected inside the block, only less often."""
    import weakref

    class Node:
        pass

    saved = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    try:
        with relaxed_gc(threshold=1_000):
            node = Node()
            node.self = node
            ref = weakref.ref(node)
            gc.collect(0)  # it survives a young collection and moves to generation 1
            del node
            live = [[] for _ in range(150_000)]  # > 100 young collections' worth of net allocations
            assert ref() is None  # a generation-1 collection ran inside the block and freed it
            del live
    finally:
        gc.set_threshold(*saved)
