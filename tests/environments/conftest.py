"""Shared pieces for the bundled-environment tests: a real tiny engine behind the real client."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


@pytest.fixture
def tiny_client(hf_engine: Any) -> Any:
    from bridges.client import EngineClient

    return EngineClient(hf_engine, model_name="tiny")


def _assert_well_formed(state: Any, min_turns: int = 1) -> None:
    assert state.num_turns >= min_turns
    for turn in state.turns:
        assert turn.prompt_ids and turn.completion_ids
        assert len(turn.logprobs) == len(turn.completion_ids)
        assert turn.message.get("role") == "assistant"
    assert state.stop_reason
    if state.errored:
        assert state.error and state.reward is None
    else:
        assert state.error is None
        assert state.reward is not None and 0.0 <= state.reward <= 1.0


@pytest.fixture
def well_formed() -> Callable[..., None]:
    """Checks a finished rollout: token ids on every model turn, and a reward in [0, 1] or an error."""
    return _assert_well_formed
