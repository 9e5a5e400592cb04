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
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

ROLLOUT_GC_THRESHOLD = 500_000
OLDER_GENERATIONS_THRESHOLD = 100  # young collections per generation-1 collection (default 10)

_lock = threading.Lock()
_depth = 0
_saved: tuple[int, int, int] | None = None


@contextlib.contextmanager
def relaxed_gc(threshold: int = ROLLOUT_GC_THRESHOLD) -> Iterator[None]:
    """Collect generation 0 every ``threshold`` allocations and generation 1 after 100 of those
    (never more often than the caller's own settings) inside the block; generation 2 keeps the
    caller's setting. The outermost exit restores the thresholds found on entry."""
    global _depth, _saved
    with _lock:
        if _depth == 0:
            _saved = gc.get_threshold()
            if _saved[0] > 0:  # 0: the caller disabled automatic collection; leave it so
                young = max(_saved[0], threshold)
                gc.set_threshold(young, max(_saved[1], OLDER_GENERATIONS_THRESHOLD), _saved[2])
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _saved is not None:
                gc.set_threshold(*_saved)
                _saved = None
