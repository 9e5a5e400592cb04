"""One GRPO optimizer step on a fixed global batch, in however many processes launched this.

``python -m one_step <out.safetensors> key=value...``: builds the trainer's own step context
(``build_step_context``: the policy on its device and dtype, sharded under fsdp, its masters and AdamW),
takes this process's share of 16 deterministic samples (sample i to process i mod N), runs
``train_step`` once and, on the main process, writes the whole trained tensors. Run alone and under
``bridges.runtime.launch`` with two processes, the files must agree.
"""

from __future__ import annotations

import random
import sys

import torch
from safetensors.torch import save_file
from torch.distributed.tensor import DTensor

from bridges.grpo.parallel import full_state_dict, start, stop, world_from_env
from bridges.grpo.policy import trainable_names
from bridges.grpo.trainer import build_step_context, train_step
from bridges.models.hardware import placement
from bridges.runs.config import parse_config
from bridges.runs.train_config import TrainConfig
from bridges.workflows.types import TrainingSample


def global_batch(vocab: int, count: int = 16, seed: int = 0) -> list[TrainingSample]:
    rng = random.Random(seed)
    samples = []
    for _ in range(count):
        prompt, completion = rng.randint(6, 14), rng.randint(2, 9)
        ids = [rng.randrange(3, vocab) for _ in range(prompt + completion)]
        samples.append(TrainingSample(
            token_ids=ids, loss_mask=[0] * prompt + [1] * completion,
            logprobs=[0.0] * prompt + [round(-rng.uniform(0.5, 4.0), 3) for _ in range(completion)],
            advantage=rng.choice([-1.0, -0.5, 0.5, 1.0]),
        ))
    return samples


def main(out: str, args: list[str]) -> None:
    config = parse_config(TrainConfig, args)
    t = config.trainer
    where, world = placement(t.device, t.dtype), world_from_env(t.strategy)
    start(world, where.device)
    torch.manual_seed(0)
    ctx, tokenizer = build_step_context(config, where, world)
    samples = global_batch(len(tokenizer))
    result = train_step(ctx, samples[world.rank :: world.size])
    state = full_state_dict(ctx.policy, trainable_names(ctx.policy))
    if world.is_main:
        tensors = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in state.items()}
        sharded = any(isinstance(p, DTensor) for p in ctx.policy.parameters())
        tensors["result.loss"] = torch.tensor([result["loss"], result["grad_norm"], float(sharded)])
        save_file(tensors, out)
    stop(finished=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
