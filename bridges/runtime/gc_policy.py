"""How often Python's cyclic garbage collector runs while rollouts are in flight.

Thousands of live rollouts are hundreds of thousands of container objects (messages, states, ledger
records, asyncio tasks), and with the default threshold (a generation-0 collection every 700 net
allocations) the collector keeps walking them: at 4,000 concurrent 3-turn rollouts it was half of
all CPU time (518 µs a model call with the default, 280 µs with a 50,000 threshold,
benchmarks/rollout_scale.py). Every object that survives a young collection is walked again by
each older one: at 10,000 rollouts with a 50,000 threshold, generation-1 and -2 collections still
took 2.9 s of a 10 s batch (``gc.callbacks`` timing). Little of that work frees anything: rollout
objects are freed by reference counting when a rollout ends; cycles (exception tracebacks, task
graphs) are rare and small and mostly die young, where the generation-0 collections still find them.

``relaxed_gc()``, for as long as any rollout batch in the process is running (nested and concurrent
uses are counted), collects generation 0 every 500,000 net allocations and the older generations
ten times less often relative to it than Python's default (generation 1 after 100 young
collections, 50 million allocations), so a 10,000-rollout batch never pays for one. They are not
switched off: a trainer that generates ahead may have a batch in flight for its whole run, and a
cycle that outlived a young collection must still be reclaimed while it runs. The caller's
thresholds come back when the last batch ends.

A batch that names how many of its rollouts run at once (``rollouts``) raises the young threshold to
``OBJECTS_PER_ROLLOUT`` per rollout when that is higher. A rollout keeps a few hundred tracked objects
alive until it ends (300 measured: 10,000 concurrent three-turn verifiers rollouts held 3 million), so
with a fixed threshold a large batch crosses it several times, and each young collection walks every
running rollout's objects and frees none of them (0 collected in all six young collections of that
batch: 0.9 s of its 13 s). Scaled, the running rollouts' own allocations stay under it. What a
collection could have freed meanwhile (cycles) is bounded by the same number, a few times what the
running rollouts hold; the rollouts waiting on a concurrency limit hold almost nothing and do not count.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

ROLLOUT_GC_THRESHOLD = 500_000
OBJECTS_PER_ROLLOUT = 1_000  # a rollout's live tracked objects (~300) with room to spare
OLDER_GENERATIONS_THRESHOLD = 100  # young collections per generation-1 collection (default 10)

_lock = threading.Lock()
_depth = 0
_saved: tuple[int, int, int] | None = None


@contextlib.contextmanager
def relaxed_gc(threshold: int = ROLLOUT_GC_THRESHOLD, rollouts: int = 0) -> Iterator[None]:
    """Collect generation 0 every ``threshold`` allocations (or ``OBJECTS_PER_ROLLOUT`` for each of
    ``rollouts`` running at once, when more) and generation 1 after 100 of those (never more often than the
    caller's own settings) inside the block; generation 2 keeps the caller's setting. A batch that
    starts while another runs raises the young threshold further if it needs more. The outermost exit
    restores the thresholds found on entry."""
    global _depth, _saved
    wanted = max(threshold, OBJECTS_PER_ROLLOUT * rollouts)
    with _lock:
        young, older, oldest = gc.get_threshold()
        if _depth == 0:  # the outermost batch: keep the caller's setting, relax the older generations
            _saved = (young, older, oldest)
            older = max(older, OLDER_GENERATIONS_THRESHOLD)
        if young > 0:  # 0: the caller disabled automatic collection; leave it so
            gc.set_threshold(max(young, wanted), older, oldest)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _saved is not None:
                gc.set_threshold(*_saved)
                _saved = None
