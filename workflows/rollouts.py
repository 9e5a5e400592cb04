"""Run groups of rollouts through any ``AsyncOpenAI`` client and turn them into scored groups.

This is the one place every backend goes through to get scored groups: the GRPO trainer, TRL's
``rollout_func``, verl's agent loop and the Tinker loop all call ``run_group``/``run_groups``, so
failure isolation and advantage rules are identical everywhere.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from bridges.envs.base import Environment, group_sampling_args
from bridges.runtime.gc_policy import relaxed_gc
from bridges.workflows.advantages import AdvantageMethod, build_group
from bridges.workflows.types import Group


async def run_group(
    env: Environment,
    row: dict[str, Any],
    client: Any,
    group_size: int,
    sampling_args: dict[str, Any] | None = None,
    *,
    model: str = "policy",
    advantage: AdvantageMethod = "grpo",
) -> Group:
    """``group_size`` rollouts of one task, scored as a group (group reward functions see them all),
    with advantages.

    Rollout failures are recorded inside the states by the environment (never raised), so one bad
    rollout cannot abort the group; it comes back masked with its stop reason. ``group_size`` is
    checked by ``Environment.run_group``, the one place every backend's groups go through.
    """
    states = await env.run_group(row, client, model, group_size, sampling_args)
    return build_group(list(states), method=advantage)


async def run_groups(
    env: Environment,
    rows: Sequence[dict[str, Any]],
    client: Any,
    group_size: int,
    sampling_args: dict[str, Any] | None = None,
    *,
    model: str = "policy",
    advantage: AdvantageMethod = "grpo",
) -> list[Group]:
    """Several groups concurrently (the environment's ``max_concurrent`` bounds rollouts in flight);
    a ``seed`` is shifted per row (``group_sampling_args``), so no two groups share noise."""
    running = min(len(rows) * group_size, env.max_concurrent)
    with relaxed_gc(rollouts=running):  # a batch of live rollouts: see bridges/runtime/gc_policy.py
        return list(
            await asyncio.gather(
                *(
                    run_group(
                        env, row, client, group_size,
                        group_sampling_args(sampling_args, row.get("example_id", j), group_size),
                        model=model, advantage=advantage,
                    )
                    for j, row in enumerate(rows)
                )
            )
        )
