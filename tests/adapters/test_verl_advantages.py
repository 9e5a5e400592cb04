"""One group, one set of advantages on every backend: ``workflows.advantages`` (grpo, Tinker) against verl's
own ``compute_grpo_outcome_advantage`` and the ``bridges_grpo`` estimator the verl backend runs, on groups of 4
and 16, with a failed member, a lone valid member and a zero-variance group; ``dr_grpo`` without the std."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

pytest.importorskip("verl")

from bridges.adapters.verl.advantages import valid_member_advantages  # noqa: E402
from bridges.workflows.advantages import group_advantages  # noqa: E402

LENGTH = 5


def verl_batch(groups: list[list[float | None]]) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """verl's tensors for these groups: the reward on each row's last response token, a failed member (None)
    as the agent loop leaves it, fully masked with reward 0."""
    rows = [(g, r) for g, group in enumerate(groups) for r in group]
    rewards, mask = torch.zeros(len(rows), LENGTH), torch.ones(len(rows), LENGTH)
    for i, (_, reward) in enumerate(rows):
        if reward is None:
            mask[i] = 0
        else:
            rewards[i, -1] = reward
    return rewards, mask, np.array([f"uid-{g}" for g, _ in rows], dtype=object)


def ours(groups: list[list[float | None]], method: str = "grpo") -> list[float]:
    return [a for group in groups for a in group_advantages(group, [r is not None for r in group], method)[0]]


@pytest.mark.parametrize("size", [4, 16])
def test_the_sample_std_and_eps_are_verls_own(size: int):
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    draw = random.Random(size)
    groups: list[list[float | None]] = [[draw.choice([0.0, 0.25, 1.0]) for _ in range(size)] for _ in range(6)]
    rewards, mask, index = verl_batch(groups)
    verl, _ = compute_grpo_outcome_advantage(rewards, mask, index)
    assert verl[:, 0].tolist() == pytest.approx(ours(groups), abs=1e-6)
    assert valid_member_advantages(rewards, mask, index)[0][:, 0].tolist() == pytest.approx(ours(groups), abs=1e-6)


def test_a_failed_member_is_out_of_the_baseline_on_verl_as_everywhere():
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    groups: list[list[float | None]] = [[1.0, 0.0, 0.0, None], [1.0, None, None, None], [0.5, 0.5, 0.5, 0.5]]
    rewards, mask, index = verl_batch(groups)
    plain, _ = compute_grpo_outcome_advantage(rewards, mask, index)
    assert plain[:3, 0].tolist() == pytest.approx([1.5, -0.5, -0.5], abs=1e-5)  # the failure counted as a 0
    assert plain[4, 0].item() == pytest.approx(1.5, abs=1e-5)  # the lone success against three zeros
    advantages, returns = valid_member_advantages(rewards, mask, index)
    assert advantages[:, 0].tolist() == pytest.approx(ours(groups), abs=1e-6)
    assert advantages[:4, 0].tolist() == pytest.approx([1.1547, -0.5774, -0.5774, 0.0], abs=1e-4)
    assert advantages[4:].abs().sum() == 0  # too few valid members, and no reward variance: no signal
    assert torch.equal(advantages, returns)


def test_dr_grpo_leaves_the_std_out_on_verl_as_everywhere():
    from omegaconf import OmegaConf

    groups: list[list[float | None]] = [[1.0, 0.0, 0.0, None], [1.0, 1.0, 0.0, 0.0]]
    rewards, mask, index = verl_batch(groups)
    config = OmegaConf.create({"norm_adv_by_std_in_grpo": False})
    advantages, _ = valid_member_advantages(rewards, mask, index, config=config)
    assert advantages[:, 0].tolist() == pytest.approx(ours(groups, "dr_grpo"), abs=1e-6)
    assert advantages[:4, 0].tolist() == pytest.approx([2 / 3, -1 / 3, -1 / 3, 0.0], abs=1e-6)
