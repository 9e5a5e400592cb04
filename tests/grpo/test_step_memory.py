"""What an engine beside the trainer leaves free (``bridges/grpo/step_memory.py``): the step's floor for its
dtype, adapter and recomputation, times the measured peak-over-floor, less what is resident when the
engine is made. Built on the meta device at Qwen2.5-0.5B's architecture: no memory, real parameter counts."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from bridges.grpo.step_memory import PEAK_OVER_FLOOR, activation_bytes, micro_batch_tokens, step_reserve_bytes
from bridges.runs.config import parse_config
from bridges.runs.train_config import TrainConfig


def qwen_05b(dtype: torch.dtype, lora: bool) -> SimpleNamespace:
    from transformers import AutoModelForCausalLM, Qwen2Config

    from bridges.grpo.precision import MasterWeights
    from bridges.models.family_models import ARCHITECTURES, QWEN25_VOCAB

    with torch.device("meta"):
        policy = AutoModelForCausalLM.from_config(Qwen2Config(vocab_size=QWEN25_VOCAB, **ARCHITECTURES["qwen2.5-0.5b"]))
    policy.to(dtype)
    if lora:
        from peft import LoraConfig, get_peft_model

        policy = get_peft_model(policy, LoraConfig(r=16, target_modules=["q_proj", "v_proj"]))
    return SimpleNamespace(policy=policy, master=MasterWeights(policy), logprob_chunk_tokens=256)


def config(*args: str) -> TrainConfig:
    return parse_config(TrainConfig, ["trainer.batch_size=8", "trainer.group_size=8", *args])


def test_a_full_bf16_step_reserves_what_it_will_still_allocate_at_qwen_05b():
    ctx = qwen_05b(torch.bfloat16, lora=False)
    params = sum(p.numel() for p in ctx.policy.parameters())
    reserve = step_reserve_bytes(ctx, config("trainer.gradient_checkpointing=true"), torch.bfloat16, 300, 1)
    resident = 6 * params  # bf16 weights + fp32 masters, made before the engine
    peak = reserve + resident
    # the step peaks at ~19 B/param measured (docs/guide/scaling.md); the estimate is 1.2 x the floor
    assert 19 <= peak / params <= 24
    assert reserve > 8 * params + 2 * 1024**3  # more than the old reserve (AdamW's moments + 2 GiB)
    plain = step_reserve_bytes(ctx, config(), torch.bfloat16, 300, 1)
    assert plain > reserve  # no recomputation: every layer's activations are kept


def test_lora_reserves_a_small_fraction_and_packing_bounds_the_activations():
    full, lora = qwen_05b(torch.bfloat16, lora=False), qwen_05b(torch.bfloat16, lora=True)
    settings = config("trainer.gradient_checkpointing=true", "trainer.micro_batch_tokens=4096")
    assert micro_batch_tokens(settings, 300, 1) == 4096
    assert micro_batch_tokens(config("trainer.grad_accum_steps=4"), 300, 2) == 8 * 300  # 4 groups of 8, in 4
    small = step_reserve_bytes(lora, settings, torch.bfloat16, 300, 1)
    assert small < step_reserve_bytes(full, settings, torch.bfloat16, 300, 1) / 3


def test_activations_follow_the_recomputation_stride():
    model_config = SimpleNamespace(num_hidden_layers=24, hidden_size=896)
    off, every, third = (activation_bytes(model_config, 1000, 2, stride) for stride in (0, 1, 3))
    assert off == 24 * 17 * 896 * 1000 * 2
    assert every == 25 * 896 * 1000 * 2 + 17 * 896 * 1000 * 2  # layer inputs + the layer being recomputed
    assert every < third < off


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_estimate_covers_the_measured_peak_over_floor(dtype: torch.dtype):
    assert PEAK_OVER_FLOOR >= 1.182  # the worst measured ratio (full fine-tuning, bf16, on this CPU)
    ctx = qwen_05b(dtype, lora=False)
    assert step_reserve_bytes(ctx, config(), dtype, 300, 1) > 0
