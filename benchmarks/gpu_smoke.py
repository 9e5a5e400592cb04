"""The bundled trainer on whatever accelerator is visible: real architectures, bf16, a few steps.

    python benchmarks/gpu_smoke.py                       # Qwen2.5-0.5B and 1.5B architectures, 3 steps each
    python benchmarks/gpu_smoke.py --arch qwen2.5-0.5b --layers 1 --batch 2 --group 2 --max-tokens 8  # a CPU

Each architecture is built with random weights (no download), then ``python -m bridges.train`` runs
on it as a user would — the default task's prompts rewarded by the share of vowels in the reply
(``smoke_env.py``: a random model's groups differ, so every step trains), ``trainer.dtype=bf16`` (fp32 on a CPU without ``--dtype``),
the hf engine (vLLM when installed, on a GPU), generation not overlapped with training
(``trainer.num_batches_ahead=0``) so each is timed alone. From the run's own ``metrics.jsonl``: generation
tokens/s (sampled tokens / time waiting for the batch), training tokens/s (tokens through the model /
optimizer-step time), peak memory (the CUDA allocator's, from each row's ``memory/peak_gb``; process RSS
on a CPU) and the trainer's MFU: training
FLOPs per token ≈ 6·N + 12·L·d·T (N parameters, L layers, width d, mean context T) over the device's
dense bf16 peak (a table; none for a CPU). Steps after the first are averaged (the first compiles and
warms up). The last line is ``key=value`` pairs per architecture.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # env=smoke_env, beside this file

# dense bf16 peaks from the vendor's datasheets; the first name found in the device's name wins, so the
# H100's PCIe and NVL forms (lower clocks and power) come before the SXM form ("NVIDIA H100 80GB HBM3")
PEAK_BF16_FLOPS = {"H100 PCIe": 756e12, "H100 NVL": 835e12, "H100": 989e12, "H200": 989e12, "A100": 312e12,
                   "L40S": 362e12, "A10": 125e12, "4090": 165e12}


def device_peak(device: torch.device) -> float | None:
    """The card's dense bf16 peak FLOP/s (None: a CPU or a card not in the table)."""
    if device.type != "cuda":
        return None
    return peak_for(torch.cuda.get_device_name(device))


def peak_for(name: str) -> float | None:
    return next((flops for key, flops in PEAK_BF16_FLOPS.items() if key in name), None)


def flops_per_token(config: Any, context: float) -> float:
    """Training FLOPs per token: forward + backward through every parameter, plus attention."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        params = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    return 6.0 * params + 12.0 * config.num_hidden_layers * config.hidden_size * context


def run_arch(arch: str, folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    from transformers import AutoConfig

    from bridges.models.family_models import build_architecture
    from bridges.models.hardware import resolve_device
    from bridges.train import main as train

    model = build_architecture(arch, folder / arch, layers=args.layers)
    device = resolve_device(args.device)
    dtype = args.dtype or ("bf16" if device.type == "cuda" else "fp32")
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)  # the first row's peak covers setup too
    code = train([f"model={model}", "env=smoke_env", f"output_dir={folder / 'runs'}", f"run_name={arch}", "progress=false",
                  f"trainer.max_steps={args.steps}", f"trainer.batch_size={args.batch}", f"trainer.group_size={args.group}",
                  f"sampling.max_tokens={args.max_tokens}", f"trainer.dtype={dtype}", f"trainer.device={args.device}",
                  "trainer.num_batches_ahead=0", "trainer.gradient_checkpointing=true", "trainer.learning_rate=1e-6"])
    assert code == 0, f"the run of {arch} failed"
    rows = [json.loads(x) for x in (folder / "runs" / arch / "metrics.jsonl").read_text().splitlines()]
    timed = rows[1:] or rows
    gen_tokens = sum(r["tokens/completion_mean"] * (r["episodes/total"] - r["episodes/masked"]) for r in timed)
    gen_s = sum(r["timing/wait_generation_s"] for r in timed)
    train_tokens, train_s = sum(r["tokens/trained"] for r in timed), sum(r["timing/train_s"] for r in timed)
    config = AutoConfig.from_pretrained(model)
    context = train_tokens / max(1, sum(r["samples/trained"] for r in timed))
    peak = device_peak(device)
    achieved = flops_per_token(config, context) * train_tokens / max(train_s, 1e-9)
    assert train_tokens > 0, f"no step of {arch} trained: every group's rewards were equal"
    # the trainer's per-step rows hold the CUDA allocator's peak (bridges.models.hardware.memory_metrics)
    memory_gb = (max(r["memory/peak_gb"] for r in rows) * 1024**3 if device.type == "cuda"
                 else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024) / 1e9
    if device.type == "cuda":
        print(f"{arch}: allocated after each step (GiB) {[round(r['memory/allocated_gb'], 2) for r in rows]}, "
              f"peak within it {[round(r['memory/peak_gb'], 2) for r in rows]}", flush=True)
    # a step's peak over what stays allocated between steps (goal <= 1.5: activations under checkpointing,
    # one chunk of logits and the engine's batch; before generation ran without autograd it was 3.5 at 0.5B)
    over_resting = (f"{max(r['memory/peak_gb'] / r['memory/allocated_gb'] for r in (rows[1:] or rows)):.2f}"
                    if device.type == "cuda" else "n/a")
    return {"arch": arch, "layers": config.num_hidden_layers, "dtype": dtype, "peak_over_resting": over_resting,
            "gen_tokens_per_s": f"{gen_tokens / max(gen_s, 1e-9):.1f}", "train_tokens_per_s": f"{train_tokens / max(train_s, 1e-9):.1f}",
            "peak_memory_gb": f"{memory_gb:.2f}", "mfu": f"{achieved / peak:.3f}" if peak else "n/a"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", action="append", help="qwen2.5-0.5b and/or qwen2.5-1.5b (default: both)")
    parser.add_argument("--layers", type=int, default=None, help="fewer decoder layers (a CPU)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8, help="prompts per step")
    parser.add_argument("--group", type=int, default=8, help="rollouts per prompt")
    parser.add_argument("--max-tokens", type=int, default=128, help="sampled tokens per rollout")
    parser.add_argument("--dtype", default=None, help="default: bf16 on CUDA, fp32 on a CPU")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    from bridges.models.hardware import resolve_device

    device = resolve_device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    results = []
    with tempfile.TemporaryDirectory() as folder:
        for arch in args.arch or ["qwen2.5-0.5b", "qwen2.5-1.5b"]:
            results.append(run_arch(arch, Path(folder), args))
            print(" ".join(f"{k}={v}" for k, v in results[-1].items()), flush=True)
    print(f"device={name.replace(' ', '_')} " + " ".join(
        f"{r['arch']}_{key}={r[key]}" for r in results for key in ("gen_tokens_per_s", "train_tokens_per_s", "peak_memory_gb", "peak_over_resting", "mfu")
    ))


if __name__ == "__main__":
    main()
