"""``algorithm.adv_estimator=bridges_grpo``: verl's own GRPO advantages over the *valid* members of each
group, so a failed rollout is left out of its group's baseline on verl as on grpo, TRL and Tinker.

The agent loop turns a rollout that failed (environment, engine or reward error, timeout, an over-long
prompt) into a fully masked sample with reward 0 (``agent_loop.py``), because verl needs a sample in its
place. verl's ``compute_grpo_outcome_advantage`` would count that 0 in the group's mean and std: on a group
[1, 0, 0, failed] the success got +1.500 and the failures -0.500 on verl against +1.155 / -0.577 on the
others. Here the same function runs on the valid rows only (its constants — the sample std, eps 1e-6 — and
``norm_adv_by_std_in_grpo``), a group with fewer than two valid members gets 0 (verl's function, given one
member, returns its raw reward), and masked rows get 0.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import torch

NAME = "bridges_grpo"


def valid_member_advantages(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: np.ndarray, config: Any = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's advantage-estimator signature: (advantages, returns), both (batch, response length)."""
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    valid = response_mask.sum(dim=-1) > 0
    members = Counter(uid for uid, ok in zip(index, valid.tolist(), strict=True) if ok)
    rows = torch.tensor([ok and members[uid] >= 2 for uid, ok in zip(index, valid.tolist(), strict=True)],
                        dtype=torch.bool)
    advantages = torch.zeros_like(token_level_rewards)
    if rows.any():
        norm = True if config is None else bool(config.get("norm_adv_by_std_in_grpo", True))
        picked, _ = compute_grpo_outcome_advantage(
            token_level_rewards[rows], response_mask[rows], index[rows.numpy()], norm_adv_by_std_in_grpo=norm
        )
        advantages[rows] = picked
    return advantages, advantages


def register() -> None:
    """Known to verl under ``NAME`` in this process (the plugin calls it in every verl process)."""
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, register_adv_est

    if ADV_ESTIMATOR_REGISTRY.get(NAME) is not valid_member_advantages:
        register_adv_est(NAME)(valid_member_advantages)
