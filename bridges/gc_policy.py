"""How often Python's cyclic garbage collector runs while rollouts are in flight.

Thousands of live rollouts are hundreds of thousands of container objects (messages, states, ledger
records, asyncio tasks), and with the default threshold (a generation-0 collection every 700 net
allocations) the collector keeps walking them: at 4,000 concurrent 3-turn rollouts it was half of
all CPU time (518 µs a model call with the default, 280 µs with a 50,000 threshold,
benchmarks/rollout_scale.py). Little of that work frees anything: rollout objects are freed by
reference counting when a rollout ends; cycles (exception tracebacks, task graphs) are rare and
small, so collecting them 70 times less often costs a little memory, not correctness.

``relaxed_gc()`` raises the generation-0 threshold for as long as any rollout batch in the process is
running (nested and concurrent uses are counted) and restores the caller's thresholds after.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

ROLLOUT_GC_THRESHOLD = 50_000

_lock = threading.Lock()
_depth = 0
_saved: tuple[int, int, int] | None = None


@contextlib.contextmanager
def relaxed_gc(threshold: int = ROLLOUT_GC_THRESHOLD) -> Iterator[None]:
    """Collect generation 0 every ``threshold`` allocations (never more often than the caller's own
    setting) inside the block; the outermost exit restores the thresholds found on entry."""
    global _depth, _saved
    with _lock:
        if _depth == 0:
            _saved = gc.get_threshold()
            if 0 < _saved[0] < threshold:  # 0: the caller disabled automatic collection; leave it so
                gc.set_threshold(threshold, _saved[1], _saved[2])
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _saved is not None:
                gc.set_threshold(*_saved)
                _saved = None
