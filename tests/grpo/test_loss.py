"""Our GRPO loss equals TRL's on an identical batch, and the off-policy loss equals a hand computation."""

from __future__ import annotations

import math
import os

import pytest
import torch

from bridges.grpo.batching import collate
from bridges.grpo.loss import LossConfig, policy_loss, sequence_logprobs
from bridges.workflows.types import TrainingSample


def _batch(
    tokenizer, generator: torch.Generator, size: int = 4, prompt_len: int = 6, completion_len: int = 5
):
    vocab = len(tokenizer)
    prompt_ids = torch.randint(10, vocab, (size, prompt_len), generator=generator)
    completion_ids = torch.randint(10, vocab, (size, completion_len), generator=generator)
    completion_mask = torch.ones(size, completion_len, dtype=torch.long)
    completion_mask[1, 3:] = 0  # a shorter completion (right padding)
    completion_mask[2, 1] = 0  # an environment token inside a completion
    advantages = torch.tensor([1.0, -0.5, 0.25, -1.5])
    return prompt_ids, completion_ids, completion_mask, advantages


@pytest.mark.parametrize(("loss_type", "aggregation"), [("grpo", "sample"), ("dr_grpo", "sample"), ("dapo", "token")])
def test_policy_loss_matches_trl_compute_loss(tiny_path, loss_type, aggregation, tmp_path):
    """TRL's loss types are trainer.loss / trainer.loss_aggregation on TRL: grpo is each sample's token mean
    averaged over samples, dapo the token mean over the step (what the bundled trainer divides by)."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(tiny_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=5,
        loss_type=loss_type,
        epsilon=0.2,
        beta=0.0,
        temperature=0.7,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
    )
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": "x"}]}] * 4)
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions), args=args,
                          train_dataset=data, processing_class=tokenizer)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train(); we call the loss directly
    gen = torch.Generator().manual_seed(0)
    prompt_ids, completion_ids, completion_mask, advantages = _batch(tokenizer, gen)
    with torch.no_grad():  # a behaviour policy slightly off the current one
        full = torch.cat([prompt_ids, completion_ids], 1)
        on_policy = sequence_logprobs(trainer.model, full, torch.ones_like(full), 0.7)[
            :, prompt_ids.size(1) - 1 :
        ]
    old_logps = on_policy + 0.3 * torch.randn(on_policy.shape, generator=gen)
    inputs = {
        "prompt_ids": prompt_ids,
        "prompt_mask": torch.ones_like(prompt_ids),
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": advantages,
        "old_per_token_logps": old_logps,
        "num_items_in_batch": completion_mask.sum(),
    }
    # "Same logits": both losses get the policy logprobs from one forward pass of the same model
    # (TRL's fused CPU kernel differs from a plain log_softmax by ~3e-3, which is not what is compared).
    full = torch.cat([prompt_ids, completion_ids], 1)
    policy_logps = sequence_logprobs(trainer.model, full, torch.ones_like(full), 0.7)[
        :, prompt_ids.size(1) - 1 :
    ]
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (
        policy_logps,
        torch.zeros_like(policy_logps),
        None,
    )
    trl_loss = trainer._compute_loss(trainer.model, inputs)

    samples = [
        TrainingSample(
            token_ids=prompt_ids[i].tolist() + completion_ids[i].tolist(),
            loss_mask=[0] * prompt_ids.size(1) + completion_mask[i].tolist(),
            logprobs=[0.0] * prompt_ids.size(1) + old_logps[i].tolist(),
            advantage=float(advantages[i]),
        )
        for i in range(4)
    ]
    batch = collate(samples, tokenizer.pad_token_id)
    logps = sequence_logprobs(trainer.model, batch.input_ids_B_L, batch.attention_mask_B_L, 0.7)
    assert torch.allclose(logps[:, prompt_ids.size(1) - 1 :], policy_logps)
    ours = policy_loss(
        logps, batch.sampler_logps_B_T, batch.advantages_B, batch.loss_mask_B_T,
        LossConfig(loss_type="dr_grpo" if loss_type == "dr_grpo" else "grpo", epsilon=0.2, max_completion_length=5,
                   aggregation=aggregation),
    )
    # train_step divides the step's summed per-sample losses by its samples, or (token) by its loss tokens
    value = ours.per_sample_B.sum() / (ours.tokens if aggregation == "token" else len(samples))
    assert abs(float(trl_loss)) > 1e-3
    assert float(value) == pytest.approx(float(trl_loss), abs=1e-5)


def test_importance_weighted_loss_equals_hand_computation():
    logps = torch.tensor([[-1.0, -2.0, -0.5]])
    sampler = torch.tensor([[-1.2, -1.0, -0.5]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    adv = torch.tensor([2.0])
    out = policy_loss(logps, sampler, adv, mask, LossConfig(epsilon=0.2, ratio_cap=None))
    r1, r2 = math.exp(0.2), math.exp(-1.0)
    t1 = -min(r1 * 2.0, min(max(r1, 0.8), 1.2) * 2.0)  # ratio 1.221 clipped to 1.2 (positive advantage)
    t2 = -min(r2 * 2.0, min(max(r2, 0.8), 1.2) * 2.0)  # ratio 0.368: the unclipped term is smaller
    assert float(out.loss) == pytest.approx((t1 + t2) / 2, abs=1e-6)
    assert out.clip_fraction == pytest.approx(0.5)
    capped = policy_loss(logps, sampler, -adv, mask, LossConfig(epsilon=0.2, ratio_cap=1.1))
    # negative advantage: -min(r*A, clip(r)*A) = max(r, clip(r)) * 2 ; the cap truncates r1 to 1.1
    expected = (max(min(r1, 1.1), 1.2) * 2.0 + max(r2, 0.8) * 2.0) / 2
    assert float(capped.loss) == pytest.approx(expected, abs=1e-6)


def test_collate_shifts_mask_and_logprobs_by_one():
    sample = TrainingSample(token_ids=[5, 6, 7, 8], loss_mask=[0, 0, 1, 1], logprobs=[0.0, 0.0, -0.1, -0.2])
    batch = collate(
        [sample, TrainingSample(token_ids=[5, 6, 9], loss_mask=[0, 1, 0], logprobs=[0, -0.3, 0])], 0
    )
    assert batch.input_ids_B_L.tolist() == [[5, 6, 7, 8], [5, 6, 9, 0]]
    assert batch.loss_mask_B_T.tolist() == [[0, 1, 1], [1, 0, 0]]
    assert batch.sampler_logps_B_T[0].tolist() == pytest.approx([0.0, -0.1, -0.2])
    assert batch.attention_mask_B_L.tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo"])
def test_env_and_tool_tokens_never_receive_gradient(loss_type):
    # turn 1 sampled [3,4], env/tool tokens [9,9], turn 2 sampled [5]: mask 1 only on sampled ids
    sample = TrainingSample(
        token_ids=[1, 2, 3, 4, 9, 9, 5],
        loss_mask=[0, 0, 1, 1, 0, 0, 1],
        logprobs=[0, 0, -0.5, -0.7, 0, 0, -0.2],
        advantage=1.3,
    )
    batch = collate([sample], pad_token_id=0)
    logps = torch.full(batch.loss_mask_B_T.shape, -0.6, requires_grad=True)
    out = policy_loss(
        logps, batch.sampler_logps_B_T, batch.advantages_B, batch.loss_mask_B_T, LossConfig(loss_type)
    )
    out.loss.backward()
    grad = logps.grad[0].tolist()
    # position t scores token t+1: sampled tokens 3,4,5 sit at positions 1,2,5
    assert [i for i, g in enumerate(grad) if g != 0.0] == [1, 2, 5]


def test_the_ratio_cap_is_verls_dual_clip_exactly():
    """backend=verl maps trainer.ratio_cap to clip_ratio_c: verl's own vanilla policy loss (token-mean over
    one sequence) equals ours to the last bit, for a positive and a negative advantage, with ratios far
    past the cap."""
    pytest.importorskip("verl")
    from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla
    from verl.workers.config.actor import ActorConfig

    from bridges.grpo.loss import LossConfig, policy_loss

    verl_config = ActorConfig(strategy="fsdp", clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=2.5,
                              ppo_micro_batch_size_per_gpu=1, ppo_mini_batch_size=1, rollout_n=1)
    generator = torch.Generator().manual_seed(0)
    old_1_T = torch.randn(1, 64, generator=generator) * 0.5 - 2
    new_1_T = old_1_T + torch.randn(1, 64, generator=generator) * 1.5  # ratios up to e^4: well past 2.5
    mask_1_T = torch.ones(1, 64)
    assert float(torch.exp(new_1_T - old_1_T).max()) > 2.5
    for advantage in (1.0, -1.0):
        theirs, _ = compute_policy_loss_vanilla(old_1_T, new_1_T, torch.full((1, 64), advantage), mask_1_T,
                                                "token-mean", verl_config)
        ours = policy_loss(new_1_T, old_1_T, torch.tensor([advantage]), mask_1_T,
                           LossConfig(loss_type="grpo", epsilon=0.2, epsilon_high=0.28, ratio_cap=2.5, beta=0.0))
        assert float(ours.per_sample_B.sum()) == pytest.approx(float(theirs), abs=1e-7)
