"""A verifiers v1 taskset rolled out through rl-bridges, one rollout per row, each checked to train on
exactly what the engine sampled (0 drift, 0 ledger breaks): the "ours" side of the equivalence tests."""

from __future__ import annotations

from typing import Any

from bridges.envs.registry import load_environment
from bridges.workflows.rollouts import run_group
from bridges.workflows.samples import SampleStats, state_to_samples


async def our_states(name: str, env_args: dict[str, Any], client: Any, sampling: dict[str, Any]) -> dict[tuple[int, str], Any]:
    """(task index, seat) -> the completed state of its rollout."""
    env = load_environment(name, **env_args)
    states = {}
    for row in env.get_dataset():
        (state,) = (await run_group(env, dict(row), client, 1, dict(sampling), model="scripted")).states
        assert state.error is None and state.stop_reason == "completed", state.error
        stats = SampleStats()
        (sample,) = state_to_samples(state, advantage=1.0, stats=stats)
        assert stats.breaks == 0 and state.drift_tokens in (0, None)
        sampled = [i for turn in state.turns for i in turn.completion_ids]
        assert [i for i, m in zip(sample.token_ids, sample.loss_mask, strict=True) if m] == sampled
        states[(row["info"]["v1_task"], row["info"]["v1_seat"])] = state
    return states
