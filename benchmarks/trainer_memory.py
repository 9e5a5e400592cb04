"""Peak memory of the bundled trainer's optimizer step, per trained parameter, against the floor.

    python benchmarks/trainer_memory.py [--layers 4] [--batch 2] [--seq 128] [--arch qwen2.5-0.5b]

A random-init model with Qwen2.5-0.5B's architecture (151,936-token vocabulary; ``--layers`` fewer
decoder layers on a CPU) is trained through the trainer's own ``build_step_context`` and
``train_step``, with gradient checkpointing, for full fine-tuning and LoRA at fp32 and bf16. The second
step is measured (the first creates AdamW's state). Peak memory is the allocator's on CUDA and, on a
CPU, the bytes of live tensor storages counted as every op creates them
(``bridges.models.tensor_memory``).

The floor of a step at a precision and batch is what that scheme cannot avoid holding at once
(``bridges.grpo.step_memory.step_floor_bytes``, which the trainer also uses to size what engines beside
it leave free): weights, gradients, fp32 master weights where the weights are half, AdamW's two fp32
moments, the layer inputs gradient checkpointing keeps (layers + 1 hidden states) and the layer being
recomputed, and one chunk of fp32 logits.
Then the logprob step alone (the vocabulary projection, log-softmax and gather at the loss positions,
forward and backward, beside the head's weight and gradient), with the full logits and chunked. The last line is ``key=value`` pairs; goals: ``worst_floor_ratio``
≤ 1.3 and ``logprob_chunked_ratio`` (chunked / full) ≤ 1/8.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from bridges.models.tensor_memory import peak_bytes

MB = 1024 * 1024


def batch(vocab: int, count: int, length: int, seed: int = 0) -> list[Any]:
    from bridges.workflows.types import TrainingSample

    rng = random.Random(seed)
    half = length // 2
    return [TrainingSample(token_ids=[rng.randrange(3, vocab) for _ in range(length)], loss_mask=[0] * half + [1] * half,
                           logprobs=[0.0] * half + [-2.0] * half, advantage=rng.choice([-1.0, 1.0]))
            for _ in range(count)]


def state_of(ctx: Any) -> list[Any]:
    """Every tensor a step starts with: weights, masters, optimizer state."""
    return [list(ctx.policy.parameters()), ctx.master.params, ctx.optimizer.state_dict()["state"]]


def measure_step(model: str, dtype: str, lora: bool, args: argparse.Namespace) -> dict[str, float]:
    """Peak bytes of the second optimizer step, the floor for that scheme and batch, trained parameters."""
    from bridges.grpo.parallel import World
    from bridges.grpo.step_memory import step_floor_bytes
    from bridges.grpo.trainer import build_step_context, train_step
    from bridges.models.hardware import placement
    from bridges.runs.config import parse_config
    from bridges.runs.train_config import TrainConfig

    settings = [f"model={model}", f"trainer.dtype={dtype}", f"trainer.device={args.device}", "trainer.learning_rate=1e-5",
                "trainer.gradient_checkpointing=true", f"trainer.logprob_chunk_tokens={args.chunk}",
                *(["trainer.lora_rank=16"] if lora else [])]
    config = parse_config(TrainConfig, settings)
    where = placement(args.device, dtype)
    ctx, tokenizer = build_step_context(config, where, World())
    samples = batch(len(tokenizer), args.batch, args.seq)
    train_step(ctx, samples)  # AdamW's state exists from here on
    peak = peak_bytes(lambda: train_step(ctx, samples), state_of(ctx), where.device)
    trained = sum(p.numel() for p in ctx.master.params)
    masters = sum(m.numel() * 4 for _, _, m in ctx.master.pairs)
    compute_bytes = torch.tensor([], dtype=where.dtype).element_size()
    floor = step_floor_bytes(ctx.policy, ctx.master.params, masters, tokens=args.batch * args.seq,
                             loss_tokens=args.batch * args.seq // 2, chunk_tokens=args.chunk,
                             compute_bytes=compute_bytes, stride=1)  # gradient_checkpointing=true
    return {"peak": peak, "floor": floor, "trained": trained}


def measure_logprobs(model: str, args: argparse.Namespace, chunked: bool) -> int:
    """Peak bytes of the logprob step itself — the vocabulary projection, log-softmax and gather at the
    loss positions, forward and backward into the hidden states and the head — above the head's weight
    and its gradient (which every way of computing it holds): the plain full-logits computation, or
    ``HeadLogprobs`` in chunks of ``--chunk`` positions (what the trainer runs)."""
    from transformers import AutoConfig

    from bridges.models.hardware import resolve_device
    from bridges.models.token_logprobs import HeadLogprobs

    config, device = AutoConfig.from_pretrained(model), resolve_device(args.device)
    generator = torch.Generator(device="cpu").manual_seed(0)
    shape = (args.logprob_batch, args.logprob_seq)
    hidden = torch.randn(*shape, config.hidden_size, generator=generator, device="cpu").to(device).requires_grad_()
    weight = torch.nn.Parameter(torch.randn(config.vocab_size, config.hidden_size, generator=generator, device="cpu").to(device))
    targets = torch.randint(0, config.vocab_size, shape, generator=generator, device="cpu").to(device)
    wanted = torch.zeros(shape, dtype=torch.bool, device=device)
    wanted[:, args.logprob_seq // 2 :] = True  # the completion half: the loss positions

    def step() -> None:
        if chunked:
            picked = HeadLogprobs.apply(hidden[wanted], weight, targets[wanted], 1.0, args.chunk)
        else:
            logits = (hidden @ weight.T).float()
            picked = (logits.gather(-1, targets[..., None]).squeeze(-1) - logits.logsumexp(-1))[wanted]
        picked.sum().backward()
        weight.grad = None

    weight.grad = torch.zeros_like(weight)  # held either way: count it from the start, then let go
    peak = peak_bytes(step, [hidden, weight, weight.grad, targets, wanted], device)
    return peak - 2 * weight.numel() * weight.element_size() - hidden.numel() * hidden.element_size()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="qwen2.5-0.5b")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default: 4 on a CPU, all on CUDA)")
    parser.add_argument("--batch", type=int, default=2, help="sequences in the measured optimizer step")
    parser.add_argument("--logprob-batch", type=int, default=8, help="sequences in the logprob step")
    parser.add_argument("--logprob-seq", type=int, default=256, help="tokens per sequence in the logprob step")
    parser.add_argument("--seq", type=int, default=128, help="tokens per sequence (half of them completion)")
    parser.add_argument("--chunk", type=int, default=256, help="trainer.logprob_chunk_tokens (its default)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--schemes", default="full_fp32,full_bf16,lora_fp32,lora_bf16",
                        help="which of the four to measure (a quick check measures fewer)")
    args = parser.parse_args()
    from bridges.models.family_models import build_architecture
    from bridges.models.hardware import resolve_device

    device = resolve_device(args.device)
    layers = args.layers or (None if device.type == "cuda" else 4)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    with tempfile.TemporaryDirectory() as folder:
        model = str(build_architecture(args.arch, Path(folder) / "model", layers=layers))
        figures: dict[str, float] = {}
        for lora in (False, True):
            for dtype in ("fp32", "bf16"):
                name = f"{'lora' if lora else 'full'}_{dtype}"
                if name not in args.schemes.split(","):
                    continue
                m = measure_step(model, dtype, lora, args)
                figures[f"{name}_ratio"] = m["peak"] / m["floor"]
                print(f"{name:10s} peak {m['peak'] / m['trained']:8.2f} B/trained param   floor "
                      f"{m['floor'] / m['trained']:8.2f}   ratio {m['peak'] / m['floor']:.3f}   "
                      f"({m['trained'] / 1e6:.1f}M trained, peak {m['peak'] / MB:.0f} MB)", flush=True)
        full = measure_logprobs(model, args, chunked=False)
        chunked = measure_logprobs(model, args, chunked=True)
    print(f"logprob step (batch {args.logprob_batch} x {args.logprob_seq}, vocab 151936): full logits {full / MB:.0f} MB, "
          f"chunked ({args.chunk} tokens) {chunked / MB:.0f} MB", flush=True)
    worst = max(figures.values())
    pairs = {"device": device.type, "arch": args.arch, "layers": layers or "all", **{k: f"{v:.3f}" for k, v in figures.items()},
             "worst_floor_ratio": f"{worst:.3f}", "logprob_full_mb": f"{full / MB:.0f}",
             "logprob_chunked_mb": f"{chunked / MB:.0f}", "logprob_chunked_ratio": f"{chunked / full:.3f}"}
    print(" ".join(f"{k}={v}" for k, v in pairs.items()))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
