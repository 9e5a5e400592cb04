"""``max_concurrent`` bounds the rollouts in flight, including when a trainer sets it after building the env."""

from __future__ import annotations

import asyncio
from typing import Any

from datasets import Dataset

import bridges as br
from bridges.workflows.rollouts import run_groups


class CountingClient:
    """An OpenAI-shaped client that records how many calls are in flight at once."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.peak = 0
        self.chat = self
        self.completions = self

    async def create(self, **kwargs: Any) -> dict[str, Any]:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        await asyncio.sleep(0.01)
        self.in_flight -= 1
        return {"choices": [{"message": {"role": "assistant", "content": "x"}, "finish_reason": "stop"}]}


async def test_setting_max_concurrent_after_construction_bounds_rollouts_in_flight():
    rows = [{"question": f"q{i}", "example_id": i} for i in range(8)]
    env = br.SingleTurnEnv(dataset=Dataset.from_list(rows), rubric=br.Rubric([lambda completion: 1.0]))
    assert env.max_concurrent == 64
    env.max_concurrent = 5  # what the grpo and Tinker trainers do with trainer.max_concurrent
    client = CountingClient()
    groups = await run_groups(env, rows, client, group_size=4)
    assert sum(len(g.states) for g in groups) == 32
    assert client.peak == 5
    env.max_concurrent = 32
    client = CountingClient()
    await run_groups(env, rows, client, group_size=4)
    assert client.peak == 32
