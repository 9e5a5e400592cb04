"""Memory and step time of the bundled trainer's optimizer step by recomputation setting.

    python benchmarks/recompute.py [--layers 8] [--batch 4] [--seq 512] [--lora-rank 16] [--arch qwen2.5-0.5b] [--repeats 3]

A random-init model with a real architecture (``--layers`` decoder layers on a CPU) is trained through
the trainer's own ``build_step_context`` and ``train_step`` under ``trainer.gradient_checkpointing``
off, every:4, every:2 and full, LoRA by default (with full fine-tuning at a small batch the optimizer
state, not the activations, sets the peak). For each: the peak memory of the second step (the allocator's on CUDA;
on a CPU the bytes of live tensor storages, ``bridges.models.tensor_memory``) and the median step time
of ``--repeats`` more, all in one run. Prints a table, then one line of ``key=value`` pairs: each
setting's peak MB and its memory and time as ratios of ``off``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

SETTINGS = ("off", "every:4", "every:2", "full")
MB = 1024 * 1024


def measure(model: str, setting: str, args: argparse.Namespace) -> tuple[float, float]:
    """(peak MB of one step, median seconds of a step) under ``setting``."""
    from trainer_memory import batch, state_of

    from bridges.grpo.parallel import World
    from bridges.grpo.trainer import build_step_context, train_step
    from bridges.models.hardware import placement
    from bridges.models.tensor_memory import peak_bytes
    from bridges.runs.config import parse_config
    from bridges.runs.train_config import TrainConfig

    config = parse_config(TrainConfig, [f"model={model}", f"trainer.dtype={args.dtype}", f"trainer.device={args.device}",
                                        "trainer.learning_rate=1e-5", f"trainer.gradient_checkpointing={setting}",
                                        f"trainer.lora_rank={args.lora_rank}"])
    where = placement(args.device, args.dtype)
    ctx, tokenizer = build_step_context(config, where, World())
    samples = batch(len(tokenizer), args.batch, args.seq)
    train_step(ctx, samples)  # AdamW's state exists from here on
    peak = peak_bytes(lambda: train_step(ctx, samples), state_of(ctx), where.device) / MB
    times = []
    for _ in range(args.repeats):
        started = time.perf_counter()
        train_step(ctx, samples)
        if where.device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return peak, statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="qwen2.5-0.5b")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default: 8 on a CPU, all on CUDA)")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--lora-rank", type=int, default=16, help="0: full fine-tuning, whose optimizer state "
                        "(not the activations) sets the peak at small batches")
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from bridges.models.family_models import build_architecture
    from bridges.models.hardware import resolve_device

    device = resolve_device(args.device)
    layers = args.layers or (None if device.type == "cuda" else 8)
    figures: dict[str, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory() as folder:
        model = str(build_architecture(args.arch, Path(folder) / "model", layers=layers))
        for setting in SETTINGS:
            figures[setting] = measure(model, setting, args)
    base_mb, base_s = figures["off"]
    print(f"{'setting':<10} {'peak MB':>9} {'x off':>7} {'step s':>8} {'x off':>7}   ({args.arch}, "
          f"{layers or 'all'} layers, {args.batch}x{args.seq} tokens, {args.dtype}, "
          f"{f'LoRA r={args.lora_rank}' if args.lora_rank else 'full fine-tuning'}, {device})")
    for setting, (mb, seconds) in figures.items():
        print(f"{setting:<10} {mb:9.1f} {mb / base_mb:7.2f} {seconds:8.3f} {seconds / base_s:7.2f}")
    line: list[str] = []
    for setting, (mb, seconds) in figures.items():
        name = setting.replace(":", "")
        line.append(f"{name}_mb={mb:.1f}")
        if setting != "off":
            line.append(f"{name}_memory_ratio={mb / base_mb:.3f} {name}_time_ratio={seconds / base_s:.3f}")
    print(" ".join(line))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
