"""Backend-neutral episode records: what one rollout taught us, in tokens.

An ``Episode`` is one rollout; its ``Trajectory`` is the ordered model calls (``Step``s) with the
exact ids the engine saw and sampled. ``TrainingSample`` is what a trainer consumes: one token
sequence with a loss mask (1 on sampled ids, 0 on prompt/environment/tool ids), the sampler's
logprobs and the group-relative advantage. Every backend (grpo, TRL, verl, Tinker) converts from
these, so a fix here fixes all of them.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from bridges.types import is_trainable


class Step(BaseModel):
    """One model call: the prompt ids it was given and what it sampled."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None = None
    weight_version: int | None = None


class Trajectory(BaseModel):
    steps: list[Step] = Field(default_factory=list)


class Episode(BaseModel):
    """One rollout of one task, scored; failed rollouts are kept (``valid`` is False) and masked."""

    example_id: int
    task: str = "default"
    trajectories: list[Trajectory] = Field(default_factory=list)
    reward: float | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    stop_reason: str | None = None
    error: str | None = None
    drift_tokens: int | None = None
    drifted_turns: int | None = None
    prompt: list[dict[str, Any]] = Field(default_factory=list)
    completion: list[dict[str, Any]] = Field(default_factory=list)
    answer: str = ""

    @property
    def has_tokens(self) -> bool:
        return any(step.completion_ids for traj in self.trajectories for step in traj.steps)

    @property
    def valid(self) -> bool:
        """Usable for training (``bridges.types.is_trainable``, the rule every backend applies)."""
        return is_trainable(self.error, self.stop_reason, self.reward, self.has_tokens)

    @property
    def num_completion_tokens(self) -> int:
        return sum(len(step.completion_ids) for traj in self.trajectories for step in traj.steps)


class TrainingSample(BaseModel):
    """One trainable token sequence (every list has the same length as ``token_ids``).

    ``loss_mask`` is 1 exactly on engine-sampled ids; ``logprobs`` holds the sampler's logprob there
    and 0.0 elsewhere. ``advantage`` is the episode's group-relative advantage (0 for masked members).
    """

    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    advantage: float = 0.0
    reward: float | None = None
    example_id: int = 0
    weight_version: int | None = None
    valid: bool = True

    @property
    def num_loss_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def prompt_length(self) -> int:
        """Ids before the first sampled id (the part no trainer computes a loss on)."""
        for i, m in enumerate(self.loss_mask):
            if m:
                return i
        return len(self.loss_mask)


class Group(BaseModel):
    """The n episodes of one task, with their group-relative advantages (aligned with ``episodes``)."""

    example_id: int
    episodes: list[Episode]
    advantages: list[float] = Field(default_factory=list)
    contributes_gradient: bool = False
    skip_reason: str | None = None  # "too_few_valid" | "zero_variance" when it contributes nothing
    states: list[Any] = Field(default_factory=list, exclude=True)  # the rollout States, for traces

    @property
    def num_valid(self) -> int:
        return sum(e.valid for e in self.episodes)
