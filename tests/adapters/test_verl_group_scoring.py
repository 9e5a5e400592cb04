"""Group scoring under verl (``adapters/verl/group_scoring.py``): n loops, one group, scored together."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from bridges.adapters.verl.group_scoring import score_in_group
from bridges.envs.types import State


class GroupEnv:
    """Records each group it scores; reward = the member's rank in its group (a group-level quantity)."""

    def __init__(self) -> None:
        self.groups: list[int] = []

    async def score(self, states: list[State]) -> None:
        self.groups.append(len(states))
        for rank, state in enumerate(sorted(states, key=lambda s: s.example_id)):
            state.reward = float(rank) if state.error is None else None


async def test_members_arriving_at_different_times_are_scored_as_one_group():
    env = GroupEnv()
    states = [State(example_id=i) for i in range(4)]

    async def member(state: State, delay: float) -> None:
        await asyncio.sleep(delay)
        await score_in_group(env, state, "uid-1", 4)

    await asyncio.gather(*(member(s, 0.01 * (3 - i)) for i, s in enumerate(states)))
    assert env.groups == [4] and [s.reward for s in states] == [0.0, 1.0, 2.0, 3.0]


async def test_a_member_that_never_arrives_masks_the_group_with_a_sentence_instead_of_hanging():
    env = GroupEnv()
    states = [State(example_id=i) for i in range(2)]
    await asyncio.wait_for(
        asyncio.gather(*(score_in_group(env, s, "uid-2", 3, wait_s=0.2) for s in states)), timeout=5
    )
    assert env.groups == []  # never scored as a smaller group
    for state in states:
        assert state.reward is None and state.stop_reason == "reward_error"
        assert "only 2 of the 3 rollouts of its group reached this agent-loop worker" in (state.error or "")


@pytest.mark.parametrize(("uid", "size"), [(None, 4), ("uid-3", 1)])
async def test_no_uid_or_a_group_of_one_scores_at_once(uid: Any, size: int):
    env = GroupEnv()
    state = State(example_id=0)
    await score_in_group(env, state, uid, size)
    assert env.groups == [1] and state.reward == 0.0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["trainer.batch_size=3", "verl.actor_rollout_ref.rollout.agent.num_workers=2"],
         "trainer.batch_size=3 is not a multiple of verl's 2 agent-loop workers"),
        (["verl.actor_rollout_ref.rollout.agent.num_workers=0"], "num_workers must be a whole number of at least 1"),
    ],
)
def test_the_launcher_refuses_worker_counts_that_would_split_a_group(
    argv: list[str], message: str, tmp_path: Any
):
    from bridges.adapters.verl.launch import BACKEND
    from bridges.runs.config import parse_config
    from bridges.runs.train_config import TrainConfig
    from bridges.runtime.errors import ConfigError

    config = parse_config(TrainConfig, ["backend=verl", *argv, f"output_dir={tmp_path}"])
    with pytest.raises(ConfigError, match=message):
        BACKEND.validate(config, BACKEND.parse_options(dict(config.verl)))


def test_a_killed_launch_keeps_its_folded_steps_and_drops_those_verl_runs_again(tmp_path: Any):
    """kill -9 after step 3 with a checkpoint at step 2: the resumed run's files hold steps 1-2 once."""
    import json

    from bridges.adapters.verl.run_files import NATIVE_METRICS, cut_back

    (tmp_path / "verl").mkdir()
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("2")
    native = [{"step": s, "data": {"actor/pg_loss": 0.1 * s, "actor/lr": 1e-3}} for s in (1, 2, 3)]
    (tmp_path / NATIVE_METRICS).write_text("".join(json.dumps(r) + "\n" for r in native) + '{"step": 4, "da')
    trace = {"reward": 1.0, "turns": [{"completion_ids": [5]}], "provenance": {"step": 3, "split": "train"}}
    (tmp_path / "traces.jsonl").write_text(json.dumps(trace) + "\n")
    assert cut_back(tmp_path, resume=True) == 2
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["loss"]) for r in rows] == [(1, 0.1), (2, 0.2)]  # the cut line 4 is dropped too
    assert (tmp_path / "traces.jsonl").read_text() == "" and not (tmp_path / NATIVE_METRICS).exists()
