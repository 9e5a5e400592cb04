"""``trainer.loss_aggregation`` means one thing on every backend: the gradient each token's logprob gets from
one step is the same through the bundled trainer's loss, verl's own policy loss under the ``loss_agg_mode``
the launcher sets, and Tinker's loss on the datums the Tinker backend builds (TRL: ``tests/grpo/test_loss.py``,
its grpo/dapo loss types against ours). The step is the issue's case: one group of a solved 10-token episode
and three 80-token failures, where episode length tracks the outcome."""

from __future__ import annotations

import pytest
import torch

from bridges.adapters.tinker.datums import sample_to_datum, token_weights
from bridges.adapters.tinker.losses import datum_loss
from bridges.grpo.batching import collate
from bridges.grpo.loss import LossConfig, policy_loss
from bridges.workflows.advantages import group_advantages
from bridges.workflows.types import TrainingSample

PROMPT, LENGTHS, REWARDS, MAX_LENGTH = 3, [10, 80, 80, 80], [1.0, 0.0, 0.0, 0.0], 128


def step_samples() -> list[TrainingSample]:
    advantages, _ = group_advantages(REWARDS, [True] * 4)
    return [TrainingSample(token_ids=list(range(PROMPT + n)), loss_mask=[0] * PROMPT + [1] * n,
                           logprobs=[0.0] * PROMPT + [-1.0] * n, advantage=a)
            for n, a in zip(LENGTHS, advantages, strict=True)]


def grpo_gradient(samples: list[TrainingSample], loss: str, aggregation: str) -> list[torch.Tensor]:
    """dL/dlogp of each sample's sampled tokens through policy_loss and train_step's normaliser."""
    batch = collate(samples, 0)
    logps = batch.sampler_logps_B_T.clone().requires_grad_(True)  # on the sampler's policy: ratio 1
    out = policy_loss(logps, batch.sampler_logps_B_T, batch.advantages_B, batch.loss_mask_B_T,
                      LossConfig(loss_type=loss, max_completion_length=MAX_LENGTH, aggregation=aggregation))  # type: ignore[arg-type]
    denominator = out.tokens if loss == "grpo" and aggregation == "token" else len(samples)
    (out.per_sample_B.sum() / denominator).backward()
    assert logps.grad is not None
    return [logps.grad[i][batch.loss_mask_B_T[i] > 0] for i in range(len(samples))]


def verl_gradient(samples: list[TrainingSample], loss: str, aggregation: str) -> list[torch.Tensor]:
    pytest.importorskip("verl")
    from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla
    from verl.workers.config.actor import ActorConfig

    from bridges.adapters.verl.launch import loss_agg_mode

    batch = collate(samples, 0)
    mode = loss_agg_mode(loss, aggregation)
    config = ActorConfig(strategy="fsdp", clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=4.0,
                         loss_agg_mode=mode, rollout_n=1, ppo_micro_batch_size_per_gpu=1, ppo_mini_batch_size=1)
    if loss == "dr_grpo":  # the launcher's actor.loss_scale_factor, which verl's workers pass to agg_loss
        config.global_batch_info["loss_scale_factor"] = MAX_LENGTH
    logps = batch.sampler_logps_B_T.clone().requires_grad_(True)
    advantages_B_T = batch.advantages_B.unsqueeze(1) * batch.loss_mask_B_T
    loss_value = compute_policy_loss_vanilla(batch.sampler_logps_B_T, logps, advantages_B_T,
                                             batch.loss_mask_B_T.float(), mode, config)[0]
    loss_value.backward()
    assert logps.grad is not None
    return [logps.grad[i][batch.loss_mask_B_T[i] > 0] for i in range(len(samples))]


def tinker_gradient(samples: list[TrainingSample], loss: str, aggregation: str) -> list[torch.Tensor]:
    weights = token_weights(samples, aggregation, loss, MAX_LENGTH)
    grads = []
    for sample, weight in zip(samples, weights, strict=True):
        inputs = {k: torch.as_tensor(v.to_numpy() if hasattr(v, "to_numpy") else v)
                  for k, v in sample_to_datum(sample, weight).loss_fn_inputs.items()}
        logp_T = inputs["logprobs"].clone().requires_grad_(True)
        datum_loss("importance_sampling", logp_T, inputs).backward()
        assert logp_T.grad is not None
        grads.append(logp_T.grad[torch.as_tensor(sample.loss_mask[1:]) > 0])
    return grads


@pytest.mark.parametrize(("loss", "aggregation", "push_ratio"),
                         [("grpo", "sample", 1.0), ("grpo", "token", 8.0), ("dr_grpo", "sample", 8.0)])
def test_every_backend_gives_each_token_the_same_gradient(loss: str, aggregation: str, push_ratio: float):
    samples = step_samples()
    ours = grpo_gradient(samples, loss, aggregation)
    for other in (verl_gradient(samples, loss, aggregation), tinker_gradient(samples, loss, aggregation)):
        for mine, theirs in zip(ours, other, strict=True):
            assert theirs.tolist() == pytest.approx(mine.tolist(), rel=1e-5, abs=1e-9)
    up, down = float(ours[0].sum()), float(sum(g.sum() for g in ours[1:]))
    assert -down / up == pytest.approx(push_ratio, rel=1e-4)  # failures pushed down / success pushed up


def test_dr_grpo_with_token_aggregation_is_refused():
    from bridges.runs.config import parse_config
    from bridges.runs.train_config import TrainConfig
    from bridges.runtime.errors import ConfigError

    with pytest.raises(ConfigError, match="^trainer.loss_aggregation=token has no place with trainer.loss=dr_grpo"):
        parse_config(TrainConfig, ["trainer.loss=dr_grpo", "trainer.loss_aggregation=token"])
