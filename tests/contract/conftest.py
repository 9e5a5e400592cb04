"""The contract suite's engines, over the tiny model fine-tuned to call a tool (``tests/tool_model.py``).

Every check runs over two client paths (``path`` fixture):
- ``in_process``: ``EngineClient(HFEngine(model))``;
- ``http``: the stock ``openai.AsyncOpenAI`` against ``bridges.serve`` on loopback, serving an
  ``EngineClient`` over its own ``HFEngine`` (same weights).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from tool_model import (  # fixtures shared with other suites
    ADD_TOOL,
    ANSWER_TEXT,
    TOOL_CALL_TEXT,
    TOOL_PROMPT,
    tool_model,
    tool_model_path,
)


@dataclass
class ClientPath:
    """One way of reaching the engine: ``client`` is an ``openai.AsyncOpenAI`` either way."""

    name: str
    client: Any
    tokenizer: Any


@pytest.fixture(scope="module")
def engines(tool_model: tuple[Any, Any]) -> Iterator[dict[str, Any]]:
    """One EngineClient in-process and one behind a loopback server, each over its own HFEngine."""
    from bridges.adapters.hf import HFEngine
    from bridges.client import EngineClient
    from bridges.server.app import serve_in_thread

    model, tokenizer = tool_model
    local_engine = HFEngine(model, tokenizer, name="tiny-tool")
    served_engine = HFEngine(model, tokenizer, name="tiny-tool")
    server = serve_in_thread(EngineClient(served_engine, model_name="tiny-tool", request_timeout=60))
    try:
        yield {
            "in_process": EngineClient(local_engine, model_name="tiny-tool", request_timeout=60),
            "server": server,
            "tokenizer": tokenizer,
        }
    finally:
        server.close()
        local_engine.close()
        served_engine.close()


@pytest.fixture(params=["in_process", "http"])
def path(request: pytest.FixtureRequest, engines: dict[str, Any]) -> ClientPath:
    import openai

    if request.param == "in_process":
        client = engines["in_process"]
    else:  # a fresh SDK client per test: its connection pool belongs to the test's event loop
        client = openai.AsyncOpenAI(base_url=engines["server"].base_url, api_key="unused", max_retries=0)
    return ClientPath(request.param, client, engines["tokenizer"])


@dataclass(frozen=True)
class ToolCase:
    tools: list[dict[str, Any]]
    prompt: list[dict[str, Any]]
    call_text: str
    answer: str


@pytest.fixture(scope="session")
def tool_case() -> ToolCase:
    """The conversation the fine-tuned model has learned (constants shared with the tests)."""
    return ToolCase([ADD_TOOL], TOOL_PROMPT, TOOL_CALL_TEXT, ANSWER_TEXT)
