"""Training tokens per second with packed micro-batches against padded ones, on completions of varied length.

    python benchmarks/packing.py [--samples 32] [--min-len 32] [--max-len 512] [--layers 4] [--repeats 3]

A random-init model with a real architecture (``--layers`` decoder layers) trains one batch of samples
whose lengths are spread uniformly between ``--min-len`` and ``--max-len`` (a prompt and a completion
that stops anywhere), through the trainer's own ``train_step``: padded micro-batches
(``trainer.grad_accum_steps=4``, each right-padded to its longest sample) against packed ones
(``trainer.micro_batch_tokens`` = a quarter of the batch's tokens, rounded up to the longest sample, so
about as many micro-batches). Real tokens per second of the median step of ``--repeats``, both in one
run. Last line: ``padded_tokens_per_s=<f> packed_tokens_per_s=<f> ratio=<packed/padded>
padding_fraction=<share of the padded micro-batches' tokens that were padding>``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def samples(count: int, low: int, high: int, vocab: int) -> list[Any]:
    from bridges.workflows.types import TrainingSample

    rng = random.Random(0)
    out = []
    for _ in range(count):
        n = rng.randint(low, high)
        prompt = min(32, n // 2)
        out.append(TrainingSample(token_ids=[rng.randrange(3, vocab) for _ in range(n)],
                                  loss_mask=[0] * prompt + [1] * (n - prompt),
                                  logprobs=[0.0] * prompt + [-2.0] * (n - prompt), advantage=rng.choice([-1.0, 1.0])))
    return out


def seconds_per_step(model: str, settings: list[str], batch: list[Any], repeats: int) -> float:
    from bridges.grpo.parallel import World
    from bridges.grpo.trainer import build_step_context, train_step
    from bridges.models.hardware import placement
    from bridges.runs.config import parse_config
    from bridges.runs.train_config import TrainConfig

    config = parse_config(TrainConfig, [f"model={model}", "trainer.device=cpu", "trainer.dtype=fp32",
                                        "trainer.learning_rate=1e-5", *settings])
    ctx, _ = build_step_context(config, placement("cpu", "fp32"), World())
    train_step(ctx, batch)  # AdamW's state exists from here on
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        train_step(ctx, batch)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="qwen2.5-0.5b")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--min-len", type=int, default=32)
    parser.add_argument("--max-len", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from bridges.models.family_models import build_architecture

    with tempfile.TemporaryDirectory() as folder:
        model = str(build_architecture(args.arch, Path(folder) / "model", layers=args.layers))
        from transformers import AutoConfig

        batch = samples(args.samples, args.min_len, args.max_len, AutoConfig.from_pretrained(model).vocab_size)
        lengths = [len(s.token_ids) for s in batch]
        real = sum(lengths)
        budget = max(max(lengths), -(-real // 4))
        padded = seconds_per_step(model, ["trainer.grad_accum_steps=4"], batch, args.repeats)
        packed = seconds_per_step(model, [f"trainer.micro_batch_tokens={budget}"], batch, args.repeats)
    slots = sum(max(lengths[i::4]) * len(lengths[i::4]) for i in range(4))  # the padded micro-batches' tokens
    print(f"{args.samples} samples of {args.min_len}-{args.max_len} tokens ({real} real), {args.arch} with "
          f"{args.layers} layers, fp32, CPU: padded {padded:.2f} s/step, packed ({budget}-token micro-batches) "
          f"{packed:.2f} s/step")
    print(f"padded_tokens_per_s={real / padded:.1f} packed_tokens_per_s={real / packed:.1f} "
          f"ratio={padded / packed:.3f} padding_fraction={1 - real / slots:.3f}")


if __name__ == "__main__":
    main()
