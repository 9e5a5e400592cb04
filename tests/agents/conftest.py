"""Fixtures for agents in other programs: a scripted engine over the real Qwen2.5 BPE vocabulary (its
replies are a function of the prompt, tool calls included) behind a real ``EngineClient``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def qwen_tokenizer(bridges_cache_dir: Path) -> Any:
    from transformers import AutoTokenizer

    from bridges.models.tiny import resolve_model_path

    return AutoTokenizer.from_pretrained(resolve_model_path("tiny-qwen2.5"))


@pytest.fixture
def scripted(qwen_tokenizer: Any) -> Any:
    """``scripted()`` -> (EngineClient, ScriptedEngine); ``scripted(script)`` replies with ``script(prompt)``."""
    from scripted_engine import ScriptedEngine

    from bridges.client import EngineClient

    def make(script: Any = None) -> tuple[Any, Any]:
        engine = ScriptedEngine(qwen_tokenizer) if script is None else ScriptedEngine(qwen_tokenizer, script)
        return EngineClient(engine, model_name="scripted"), engine

    return make


@pytest.fixture
async def server() -> Any:
    """A loopback session server in the test's event loop."""
    from bridges.agents.loopback import LoopbackServer

    server = LoopbackServer()
    await server.start()
    yield server
    await server.aclose()
