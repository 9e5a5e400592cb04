"""Fixtures for agents in other programs: a loopback session server (the scripted engine behind a real
``EngineClient``, ``scripted``, lives in ``tests/conftest.py``: the fault suite attacks agents too)."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture
async def server() -> Any:
    """A loopback session server in the test's event loop."""
    from bridges.agents.loopback import LoopbackServer

    server = LoopbackServer()
    await server.start()
    yield server
    await server.aclose()
