"""Group-relative advantages over the valid members of a group only.

A failed rollout never enters the baseline as a fake zero: it is masked and gets advantage 0.
A group with fewer than two valid members, or with no reward variance, carries no learning
signal; it contributes no gradient and is counted, so a run that stops learning says why.
"""

from __future__ import annotations

import math
import typing
from typing import Literal, cast

from bridges.envs.types import State
from bridges.workflows.types import Group

AdvantageMethod = Literal["grpo", "dr_grpo"]


def advantage_method(name: str) -> AdvantageMethod:
    """A config string (``trainer.loss``) as an advantage method, refused in one sentence if unknown."""
    if name not in typing.get_args(AdvantageMethod):
        from bridges.runtime.errors import ConfigError

        raise ConfigError(
            f"trainer.loss must be one of {', '.join(typing.get_args(AdvantageMethod))}; got '{name}'."
        )
    return cast(AdvantageMethod, name)


def group_advantages(
    rewards: list[float | None],
    valid: list[bool],
    method: AdvantageMethod = "grpo",
    eps: float = 1e-6,
) -> tuple[list[float], str | None]:
    """Advantages aligned with ``rewards``; the second value says why the group was skipped, if it was.

    ``grpo``: (r - mean) / (std + eps) with the sample std (Bessel's n - 1), as verl's
    ``compute_grpo_outcome_advantage`` computes it (eps 1e-6 too) and TRL does (``torch.std``; its eps is
    1e-4), so one group gets one set of advantages on every backend; ``dr_grpo``: r - mean (Dr. GRPO drops
    the std division, which over-weights near-deterministic prompts).
    """
    if method not in ("grpo", "dr_grpo"):
        raise ValueError(f"unknown advantage method '{method}'; use 'grpo' or 'dr_grpo'.")
    members = [float(r) for r, ok in zip(rewards, valid, strict=True) if ok and r is not None]
    zeros = [0.0] * len(rewards)
    if len(members) < 2:
        return zeros, "too_few_valid"
    mean = sum(members) / len(members)
    std = math.sqrt(sum((r - mean) ** 2 for r in members) / (len(members) - 1))
    if std == 0.0:
        return zeros, "zero_variance"
    scale = 1.0 / (std + eps) if method == "grpo" else 1.0
    advantages = [
        (float(r) - mean) * scale if ok and r is not None else 0.0
        for r, ok in zip(rewards, valid, strict=True)
    ]
    return advantages, None


def build_group(states: list[State], method: AdvantageMethod = "grpo") -> Group:
    """Wrap one task's rollouts with their advantages and whether the group can teach anything."""
    if not states:
        raise ValueError("a group needs at least one rollout.")
    advantages, skip = group_advantages([s.reward for s in states], [s.trainable for s in states], method)
    return Group(
        example_id=states[0].example_id,
        states=list(states),
        advantages=advantages,
        contributes_gradient=skip is None,
        skip_reason=skip,
    )
