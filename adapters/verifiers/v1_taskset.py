"""A verifiers v1 taskset bounded and read the same way under verifiers 0.3.x and 0.4.x.

The two releases name their views differently, and only by release (not by a probe of the object):
- 0.3.x: ``head(n)`` bounds a taskset (a view shadows ``INFINITE``), ``shuffle(seed)`` refuses an
  infinite one;
- 0.4.x: ``take(n)`` bounds it (``bounded`` says whether iterating ends), and ``shuffle``,
  ``include`` and ``exclude`` refuse unbounded views; ``head`` is gone.
Every read of a taskset in this adapter goes through ``tasks_of``, so a taskset that yields forever (a
self-play generator) is read as far as ``MAX_TASKS`` under either release. Nothing here shuffles or
selects: the backends order and pick rows themselves (their samplers, ``num_examples``).
"""

from __future__ import annotations

from typing import Any

from bridges.adapters.verifiers.support import FIRST_V1_ONLY, installed_version, version_tuple

MAX_TASKS = 100_000  # an infinite taskset is read this far: more rows than a run here takes an epoch of


def _takes(vf: Any) -> bool:
    """Whether this release bounds a taskset with ``take`` (0.4) rather than ``head`` (0.3)."""
    return version_tuple(installed_version(vf)) >= FIRST_V1_ONLY


def is_infinite(taskset: Any, vf: Any) -> bool:
    """Whether iterating ``taskset`` may not end (0.4: not ``bounded``; 0.3: ``INFINITE``)."""
    return not taskset.bounded if _takes(vf) else bool(taskset.INFINITE)


def first(taskset: Any, count: int, vf: Any) -> Any:
    """A lazy view of the first ``count`` tasks (finite whatever ``taskset`` is)."""
    return taskset.take(count) if _takes(vf) else taskset.head(count)


def tasks_of(taskset: Any, vf: Any) -> list[Any]:
    """Every task of ``taskset``, or its first ``MAX_TASKS`` when it yields forever."""
    return list(first(taskset, MAX_TASKS, vf) if is_infinite(taskset, vf) else taskset)
