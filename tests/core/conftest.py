"""Fixtures for the environment-core tests."""

from __future__ import annotations

import pytest
from core_fakes import ChatServer


@pytest.fixture
def server() -> ChatServer:
    return ChatServer()
