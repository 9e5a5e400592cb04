"""Fixtures for the client unit tests: the real tiny tokenizer and a scripted, real ``Engine``.

``ScriptedEngine`` implements the Engine protocol for real: it tokenizes scripted reply texts with
the tiny tokenizer and applies max_tokens, stop strings and stop_token_ids the way an engine does,
so the client's ledger, parsing and argument mapping are tested on genuine token ids without a
model forward pass. The contract suite (tests/contract/) runs the same client on the HF engine.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from bridges.envs.types import Sample, SamplingParams
from bridges.models.tiny import build_tiny_tokenizer


@dataclass
class EngineCall:
    prompt_ids: list[int]
    params: SamplingParams
    n: int


@dataclass
class ScriptedEngine:
    """Replies with scripted texts (cycled); appends EOS unless the reply is cut by length or a stop."""

    tokenizer: Any
    replies: list[str] | Callable[[str, int], str] = field(default_factory=lambda: ["ok"])
    max_model_len: int = 4096
    weight_version: int = 0
    delay: float = 0.0
    fail_with: BaseException | None = None
    calls: list[EngineCall] = field(default_factory=list)
    name: str = "scripted"
    _count: int = 0

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids

    def _next_text(self, prompt_ids: list[int]) -> str:
        index = self._count
        self._count += 1
        if callable(self.replies):
            prompt = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
            return self.replies(prompt, index)
        return self.replies[index % len(self.replies)]

    def _sample(self, text: str, params: SamplingParams) -> Sample:
        finish = "stop"
        stop_str = None
        cut = [(text.find(s), s) for s in params.stop if s in text]
        if cut:
            at, stop_str = min(cut)
            text = text[: at + len(stop_str)]
        ids = self._encode(text)
        if stop_str is None:
            for k, token_id in enumerate(ids):
                if token_id in params.stop_token_ids:
                    ids = ids[: k + 1]
                    break
            else:
                ids = [*ids, self.tokenizer.eos_token_id]
        if len(ids) > params.max_tokens:
            ids, finish, stop_str = ids[: params.max_tokens], "length", None
        logprobs = [-0.1 * (1 + (i % 7)) for i in range(len(ids))]
        return Sample(ids, logprobs, finish, weight_version=self.weight_version, stop_str=stop_str)

    async def aclose(self) -> None:  # nothing to release
        return None

    async def generate(self, prompt_ids: list[int], params: SamplingParams, n: int = 1) -> list[Sample]:
        self.calls.append(EngineCall(list(prompt_ids), params, n))
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.fail_with is not None:
            raise self.fail_with
        return [self._sample(self._next_text(prompt_ids), params) for _ in range(n)]


@pytest.fixture(scope="session")
def tok() -> Any:
    return build_tiny_tokenizer()


@pytest.fixture
def make_engine(tok: Any) -> Callable[..., ScriptedEngine]:
    def make(replies: Any = ("ok",), **kwargs: Any) -> ScriptedEngine:
        return ScriptedEngine(tok, list(replies) if not callable(replies) else replies, **kwargs)

    return make


@pytest.fixture
def make_client(make_engine: Callable[..., ScriptedEngine]) -> Callable[..., Any]:
    from bridges.client import EngineClient

    def make(replies: Any = ("ok",), engine_kwargs: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        engine = make_engine(replies, **(engine_kwargs or {}))
        return EngineClient(engine, **kwargs), engine

    return make
