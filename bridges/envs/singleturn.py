"""One model turn per rollout: question in, answer out (math, QA, classification)."""

from __future__ import annotations

from typing import Any

from bridges.envs.multiturn import MultiTurnEnv, stop
from bridges.envs.types import Messages, State, StopReason


class SingleTurnEnv(MultiTurnEnv):
    """Stops with ``completed`` after the first model turn; the environment never replies."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.pop("max_turns", None)
        super().__init__(max_turns=1, **kwargs)

    @stop(priority=100, reason=StopReason.COMPLETED.value)
    def answered(self, state: State) -> bool:
        return len(state.turns) >= 1

    async def env_response(self, messages: Messages, state: State) -> Messages:
        return []
