"""Tinker's built-in losses, per datum, in torch: what the local server's ``forward_backward`` computes.

Every tensor is aligned the Tinker way: position ``t`` of ``model_input`` predicts
``target_tokens[t]``. Losses are summed over tokens and datums with no normalisation (Tinker's
contract); a token whose advantage (or weight) is 0, such as a prompt or tool token, contributes
nothing, so the RL losses need no separate mask.

- ``cross_entropy``: ``-w * logp``
- ``importance_sampling``: ``-exp(logp - logp_sampler) * A``
- ``ppo``: ``-min(r * A, clip(r, lo, hi) * A)`` (defaults lo=0.8, hi=1.2)
- ``cispo``: ``-stopgrad(clip(r, lo, hi)) * logp * A`` (defaults lo=0.0, hi=4.0)
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

LOSS_FNS = ("cross_entropy", "importance_sampling", "ppo", "cispo")
CLIP_DEFAULTS = {"ppo": (0.8, 1.2), "cispo": (0.0, 4.0)}


class LossInputError(ValueError):
    """A datum lacks an input its loss needs, or the loss is not one this server implements."""


def datum_loss(
    loss_fn: str,
    logp_T: torch.Tensor,
    inputs: Mapping[str, torch.Tensor],
    config: Mapping[str, float] | None = None,
) -> torch.Tensor:
    """The summed loss of one datum (a scalar that carries gradient through ``logp_T``)."""
    if loss_fn not in LOSS_FNS:
        raise LossInputError(f"loss_fn '{loss_fn}' is not supported here; use one of {', '.join(LOSS_FNS)}.")
    needed = ("weights",) if loss_fn == "cross_entropy" else ("logprobs", "advantages")
    missing = [name for name in needed if name not in inputs]
    if missing:
        raise LossInputError(
            f"loss_fn '{loss_fn}' needs loss_fn_inputs {missing[0]!r}, which this datum lacks."
        )
    if loss_fn == "cross_entropy":
        return -(inputs["weights"] * logp_T).sum()
    advantages_T = inputs["advantages"]
    ratio_T = torch.exp(logp_T - inputs["logprobs"])
    if loss_fn == "importance_sampling":
        return -(ratio_T * advantages_T).sum()
    default_lo, default_hi = CLIP_DEFAULTS[loss_fn]
    lo = float((config or {}).get("clip_low_threshold", default_lo))
    hi = float((config or {}).get("clip_high_threshold", default_hi))
    clipped_T = torch.clamp(ratio_T, lo, hi)
    if loss_fn == "ppo":
        return -torch.minimum(ratio_T * advantages_T, clipped_T * advantages_T).sum()
    return -(clipped_T.detach() * logp_T * advantages_T).sum()  # cispo
