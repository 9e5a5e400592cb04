"""What trainers consume: scored groups of rollouts and the token samples made from them.

A rollout has exactly one record, the environment's ``bridges.envs.types.State`` (its ``turns`` hold the
exact ids the engine saw and sampled); a ``Group`` is one task's States with their group-relative
advantages. ``TrainingSample`` is what a trainer consumes: one token sequence with a loss mask (1 on
sampled ids, 0 on prompt/environment/tool ids), the sampler's logprobs and the advantage. Every
backend (grpo, TRL, verl, Tinker) converts from these, so a fix here fixes all of them.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from bridges.envs.types import State


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
    """The n rollouts of one task, with their group-relative advantages (aligned with ``states``)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    example_id: int
    states: list[State]
    advantages: list[float] = Field(default_factory=list)
    contributes_gradient: bool = False
    skip_reason: str | None = None  # "too_few_valid" | "zero_variance" when it contributes nothing

    @property
    def num_valid(self) -> int:
        return sum(s.trainable for s in self.states)
