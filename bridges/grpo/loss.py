"""The GRPO policy loss, written so each term can be checked against TRL and by hand.

Shapes: ``B`` sequences, ``T`` completion positions (right-padded). ``logps_B_T`` are the current
policy's logprobs of the sampled ids, ``sampler_logps_B_T`` the logprobs the engine reported when
it sampled them, ``mask_B_T`` is 1 on engine-sampled ids only (0 on padding, prompt, env/tool ids).

Off-policy correction: the importance ratio is taken against the *sampler* (behaviour policy), not
a recomputed "old" policy. With ``num_batches_ahead > 0`` the sampler is one or more optimizer
steps behind and may run a different kernel (vLLM); the PPO clip bounds the update in both cases,
and ``ratio_cap`` (two-sided truncation, TRL's ``delta``) stops a rare huge ratio from dominating.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

LossType = Literal["grpo", "dr_grpo"]


@dataclass(frozen=True)
class LossConfig:
    loss_type: LossType = "grpo"
    epsilon: float = 0.2
    epsilon_high: float | None = None  # None: symmetric clip
    ratio_cap: float | None = None  # two-sided truncation of the unclipped ratio
    beta: float = 0.0  # KL to the reference policy (k3 estimator)
    max_completion_length: int = 256  # dr_grpo's constant normaliser
    aggregation: str = "sample"  # grpo: "sample" (each sequence's token mean) or "token" (its token sum)

    @property
    def token_mean(self) -> bool:
        """The step's loss is one mean over its loss tokens: each sequence gives its token sum, and the trainer
        divides the step's sum by the step's loss tokens (otherwise by its samples)."""
        return self.loss_type == "grpo" and self.aggregation == "token"


@dataclass
class LossOutput:
    loss: torch.Tensor  # the batch's loss: the mean of per_sample_B
    per_sample_B: torch.Tensor  # each sequence's loss (a trainer normalising over several batches sums these,
    # then divides by the step's samples, or under aggregation="token" by its loss tokens)
    clip_fraction: float
    mean_ratio: float
    kl: float
    tokens: float  # loss tokens, and the token sums behind the three means above
    clipped_tokens: float
    ratio_sum: float
    kl_sum: float


def policy_loss(
    logps_B_T: torch.Tensor,
    sampler_logps_B_T: torch.Tensor,
    advantages_B: torch.Tensor,
    mask_B_T: torch.Tensor,
    config: LossConfig,
    ref_logps_B_T: torch.Tensor | None = None,
) -> LossOutput:
    """Clipped importance-weighted policy-gradient loss, aggregated as ``grpo`` or ``dr_grpo``."""
    mask_B_T = mask_B_T.to(logps_B_T.dtype)
    advantages_B_1 = advantages_B.unsqueeze(1)
    ratio_B_T = torch.exp(logps_B_T - sampler_logps_B_T)
    eps_high = config.epsilon if config.epsilon_high is None else config.epsilon_high
    clipped_B_T = torch.clamp(ratio_B_T, 1 - config.epsilon, 1 + eps_high)
    unclipped_B_T = ratio_B_T if config.ratio_cap is None else torch.clamp(ratio_B_T, max=config.ratio_cap)
    per_token_B_T = -torch.min(unclipped_B_T * advantages_B_1, clipped_B_T * advantages_B_1)

    kl_sum = 0.0
    if config.beta != 0.0:
        if ref_logps_B_T is None:
            raise ValueError("beta != 0 needs reference-model logprobs (ref_logps_B_T).")
        delta_B_T = ref_logps_B_T - logps_B_T
        kl_B_T = torch.exp(delta_B_T) - delta_B_T - 1
        per_token_B_T = per_token_B_T + config.beta * kl_B_T
        kl_sum = float((kl_B_T * mask_B_T).sum())

    if config.token_mean:  # each sequence's sum: the trainer divides the step's sum by its loss tokens
        per_sample_B = (per_token_B_T * mask_B_T).sum(-1)
    elif config.loss_type == "grpo":  # each sequence's mean over its loss tokens
        per_sample_B = (per_token_B_T * mask_B_T).sum(-1) / mask_B_T.sum(-1).clamp(min=1.0)
    elif config.loss_type == "dr_grpo":  # each sequence's sum over a constant length
        per_sample_B = (per_token_B_T * mask_B_T).sum(-1) / config.max_completion_length
    else:
        raise ValueError(f"unknown loss_type '{config.loss_type}'; use 'grpo' or 'dr_grpo'.")

    with torch.no_grad():
        tokens = float(mask_B_T.sum())
        is_clipped = ((ratio_B_T < 1 - config.epsilon) & (advantages_B_1 < 0)) | (
            (ratio_B_T > 1 + eps_high) & (advantages_B_1 > 0)
        )
        clipped = float((is_clipped.to(mask_B_T.dtype) * mask_B_T).sum())
        ratio_sum = float((ratio_B_T * mask_B_T).sum())
    shown = max(tokens, 1.0)
    return LossOutput(loss=per_sample_B.mean(), per_sample_B=per_sample_B, clip_fraction=clipped / shown,
                      mean_ratio=ratio_sum / shown, kl=kl_sum / shown, tokens=tokens, clipped_tokens=clipped,
                      ratio_sum=ratio_sum, kl_sum=kl_sum)


def sequence_logprobs(
    model: torch.nn.Module,
    input_ids_B_L: torch.Tensor,
    attention_mask_B_L: torch.Tensor,
    temperature: float = 1.0,
    wanted_B_T: torch.Tensor | None = None,
    chunk_tokens: int = 256,
    chunked: bool = True,
    fp32_grad: Callable[[torch.Tensor], torch.Tensor | None] | None = None,
    packed: bool = False,
) -> torch.Tensor:
    """Logprob of each token given its prefix: out[:, t] = log p(ids[t+1] | ids[:t+1]), shape (B, L-1),
    float32; only where ``wanted_B_T`` (default: every real token), 0 elsewhere.

    Logits are divided by the sampling temperature so the ratio compares the same distribution the
    engine sampled from (the engine reports temperature-scaled logprobs). The vocabulary projection runs
    in chunks (``bridges.models.token_logprobs``) unless ``chunked`` is false; ``packed`` runs the rows as
    one row without padding (the same logprobs, no compute on padding).
    """
    from bridges.models.token_logprobs import token_logprobs

    targets_B_L = torch.roll(input_ids_B_L, -1, dims=1)
    if wanted_B_T is None:
        wanted_B_T = attention_mask_B_L[:, 1:]
    wanted_B_L = torch.cat([wanted_B_T, torch.zeros_like(wanted_B_T[:, :1])], dim=1)
    logps_B_L = token_logprobs(model, input_ids_B_L, attention_mask_B_L, targets_B_L, wanted_B_L,
                               temperature=temperature, chunk_tokens=chunk_tokens, chunked=chunked,
                               fp32_grad=fp32_grad, packed=packed)
    return logps_B_L[:, :-1]
