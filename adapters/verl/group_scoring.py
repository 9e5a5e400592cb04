"""Group scoring under verl: the n rollouts of one prompt are scored together, as on every backend.

verl runs each trajectory in its own agent loop, so scoring inside the loop would show a group reward
function (and an environment's ``score_group``) a group of one. verl gives every member of a group
the same ``uid`` and hands a batch to its agent-loop workers in contiguous chunks, so when the batch's
prompts divide evenly among the workers (the launcher checks it), all n members of a group run in one
worker process. Each loop here waits at the group's rendezvous; the last member to arrive scores the
whole group (``Environment.score``, with its non-finite guard) and releases the others.

A member that never arrives (a group split across workers by a configuration the launcher did not
build) is not waited for forever: after ``GROUP_WAIT_S`` every waiting member is masked with one
sentence saying why, rather than scored as a smaller group, which would be wrong.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from bridges.envs.types import State, StopReason

GROUP_WAIT_S = 1800.0


@dataclass
class _Rendezvous:
    expected: int
    states: list[State] = field(default_factory=list)
    scored: asyncio.Event = field(default_factory=asyncio.Event)


_GROUPS: dict[str, _Rendezvous] = {}


async def score_in_group(
    env: Any, state: State, uid: str | None, size: int, wait_s: float = GROUP_WAIT_S
) -> None:
    """Score ``state`` together with the other ``size - 1`` rollouts that carry ``uid``."""
    if uid is None or size <= 1:
        await env.score([state])
        return
    group = _GROUPS.setdefault(uid, _Rendezvous(size))
    group.states.append(state)
    if len(group.states) == group.expected:
        _GROUPS.pop(uid, None)
        try:
            await env.score(group.states)
        finally:
            group.scored.set()
        return
    try:
        await asyncio.wait_for(group.scored.wait(), wait_s)
    except TimeoutError:
        _GROUPS.pop(uid, None)
        for member in group.states:
            member.reward, member.stop_reason = None, StopReason.REWARD_ERROR.value
            member.error = (
                f"only {len(group.states)} of the {size} rollouts of its group reached this agent-loop worker "
                f"in {wait_s:.0f} s, so the group could not be scored together; make trainer.batch_size a "
                "multiple of verl.actor_rollout_ref.rollout.agent.num_workers."
            )
        group.scored.set()
