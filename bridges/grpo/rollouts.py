"""Where the GRPO trainer's rollouts run: one small interface, two implementations.

``InProcessRollouts`` runs the environment, the ``EngineClient`` and the engine on the trainer's
event loop; ``ProcessRollouts`` (``rollout_process.py``) runs them in a child process that takes new
weights through shared memory. The trainer's loop sees only ``Rollouts``, so it reads as one path
whichever is chosen (``trainer.rollout_process``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import torch

from bridges.envs.types import TrainableEngine
from bridges.grpo.policy import sync_weights
from bridges.workflows.advantages import AdvantageMethod
from bridges.workflows.types import Group


class Rollouts(Protocol):
    name: str  # the engine, for trace provenance

    @property
    def weight_version(self) -> int: ...

    def start(self, rows: list[dict[str, Any]], args: dict[str, Any]) -> asyncio.Future[list[Group]]:
        """Begin generating one batch (``rows``, sampling ``args``); the future holds its scored groups."""
        ...

    async def update_weights(self, state: dict[str, torch.Tensor], policy: torch.nn.Module) -> None:
        """Hand the policy's trained tensors (``state``, whole tensors by name) to the engine; the weight
        version increments."""
        ...

    async def offload(self) -> bool:
        """The trainer is about to step: free the engine's accelerator memory if it was asked to
        (vLLM's sleep mode); the next ``update_weights`` brings it back. True when the engine let go of
        its weights, so the trainer must push weights after the step even if it skipped it."""
        ...

    async def aclose(self) -> None: ...


class InProcessRollouts:
    """Rollouts on this event loop: ``run_groups`` over an ``EngineClient`` on ``engine``."""

    def __init__(
        self, engine: TrainableEngine, env: Any, group_size: int, model: str, advantage: AdvantageMethod,
        offload: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        from bridges.client import EngineClient

        self.engine = engine
        self._offload = offload  # the vLLM engine's asleep, under vllm.enable_sleep_mode=true
        self.name = engine.name
        self._client = EngineClient(engine, model_name=model)
        self._env, self._group_size, self._model, self._advantage = env, group_size, model, advantage

    @property
    def weight_version(self) -> int:
        return int(self.engine.weight_version)

    def start(self, rows: list[dict[str, Any]], args: dict[str, Any]) -> asyncio.Future[list[Group]]:
        from bridges.workflows.rollouts import run_groups

        return asyncio.ensure_future(
            run_groups(self._env, rows, self._client, self._group_size, args, model=self._model,
                       advantage=self._advantage)
        )

    async def update_weights(self, state: dict[str, torch.Tensor], policy: torch.nn.Module) -> None:
        await sync_weights(self.engine, state, policy)

    async def offload(self) -> bool:
        return bool(await self._offload()) if self._offload is not None else False

    async def aclose(self) -> None:
        await self.engine.aclose()
