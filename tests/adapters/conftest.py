"""Adapter tests: the shared tool-calling model, the small TRL test environments on sys.path, and the
lock the tests that start a Ray cluster take turns under."""

from __future__ import annotations

import fcntl
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from tool_model import tool_model, tool_model_path

sys.path.insert(0, str(Path(__file__).parent / "envs"))


@pytest.fixture
def ray_alone(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """One Ray cluster started by the tests at a time, across pytest workers, all with token auth off (a
    GCS and its client in one process must agree on it: a client that read 'disabled' earlier in the
    worker was refused by a fresh GCS in token mode)."""
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    with open(Path(tempfile.gettempdir()) / "bridges-tests-ray.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the test ends, or with the process
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)

