"""The bundled trainer against TRL's ``GRPOTrainer`` on the same device, in one run: same model, task,
batch, group and lengths, each side run as its users run it.

    python benchmarks/gpu_vs_trl.py                      # a GPU: Qwen2.5-0.5B and 1.5B shapes, all layers
    python benchmarks/gpu_vs_trl.py --arch qwen2.5-0.5b --layers 1 --batch 2 --group 2 --max-tokens 8 --steps 2  # CPU (CI)

Each architecture is built with random weights (no download). Every run trains the GPU smoke task
(``smoke_env.py``: the default task's prompts, reward = share of vowels, so every group has reward
variance and every step trains) for ``--steps`` steps of ``--batch`` prompts x ``--group`` rollouts of
at most ``--max-tokens`` tokens, temperature 1, no KL term, gradient checkpointing on, the same
learning rate. Four rows, like with like:
- ``ours_ahead0`` / ``ours_ahead1``: ``python -m bridges.train`` in bf16 with fp32 masters (fp32 on a
  CPU), its default engine (named in the figures: ``engine=``), generation not overlapped with training
  (``trainer.num_batches_ahead=0``, synchronous like TRL) and overlapped one batch ahead (our default);
- ``trl_amp``: TRL as its users run it on a GPU, fp32 weights with ``bf16=True`` (autocast; fp32
  AdamW state), its own generation (``use_vllm=False``; vLLM colocate with ``--trl-vllm``);
- ``trl_bf16``: TRL with the model loaded in bf16 (pure-bf16 AdamW: cheaper, but at lr 1e-6 its weights
  barely move, so it is not the same training; kept as a second row, not the baseline).
Per row: samples per second over the steps after the first (the first compiles and warms up) and peak
memory (the CUDA allocator's; a CPU's RSS is the process's, so only the first row has one). Ours also:
generation tokens/s (from the ``ours_ahead0`` row, where the trainer waits for all of generation; n/a
without it), training tokens/s and the training step's MFU against the card's dense bf16 peak
(``gpu_smoke.device_peak``). The ratio is ours (one batch ahead) over TRL as its users run it
(``trl_amp``). Last line: ``device=<name> <arch>_ratio=… <arch>_<row>_samples_per_s=… <arch>_<row>_peak_gb=…
<arch>_engine=… <arch>_gen_tokens_per_s=… <arch>_train_tokens_per_s=… <arch>_mfu=…``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # smoke_env and gpu_smoke, beside this file

from gpu_smoke import device_peak, flops_per_token  # noqa: E402


def peak_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def run_ours(model: Path, out: Path, args: argparse.Namespace, dtype: str, ahead: int) -> dict[str, Any]:
    """``out``: this architecture's own folder (one run folder per run)."""
    from bridges.train import main as train

    name = f"ours{ahead}"
    code = train([f"model={model}", "env=smoke_env", f"output_dir={out}", f"run_name={name}", "progress=false",
                  f"trainer.max_steps={args.steps}", f"trainer.batch_size={args.batch}", f"trainer.group_size={args.group}",
                  f"sampling.max_tokens={args.max_tokens}", f"trainer.dtype={dtype}", f"trainer.device={args.device}",
                  f"trainer.num_batches_ahead={ahead}", "trainer.gradient_checkpointing=full",
                  f"trainer.learning_rate={args.lr}", "trainer.beta=0"])
    assert code == 0, "our run failed"
    rows = [json.loads(x) for x in (out / name / "metrics.jsonl").read_text().splitlines()]
    from bridges.workflows.traces import TRACES_FILE, read_traces

    engine = next(read_traces(out / name / TRACES_FILE))["provenance"]["engine"]
    timed = rows[1:] or rows
    gen_tokens = sum(
        r["tokens/completion_mean"] * (r["episodes/total"] - r["episodes/masked"]) for r in timed
    )
    train_tokens = sum(r["tokens/trained"] for r in timed)
    train_s = sum(r["timing/train_s"] for r in timed)
    return {"samples_per_s": args.batch * args.group / statistics.mean(r["timing/step_s"] for r in timed),
            # the trainer's wait for a batch: all of generation when nothing runs ahead (ahead=0)
            "gen_tokens_per_s": gen_tokens / max(sum(r["timing/wait_generation_s"] for r in timed), 1e-9),
            "train_tokens_per_s": train_tokens / max(train_s, 1e-9), "train_tokens": train_tokens, "train_s": train_s,
            "context": train_tokens / max(1, sum(r["samples/trained"] for r in timed)), "engine": engine}


def run_trl(
    model: Path, out: Path, args: argparse.Namespace, weights: str, device: torch.device
) -> dict[str, float]:
    """TRL's trainer with the model loaded in ``weights`` (fp32 or bf16); autocast in bf16 on a GPU."""
    import smoke_env
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    env = smoke_env.load_environment()
    data = Dataset.from_list([{"prompt": dict(r)["prompt"]} for r in env.get_dataset()])

    def vowel_share(completions: list[Any], **_: Any) -> list[float]:
        return [smoke_env.vowel_share(c) for c in completions]

    step_ends: list[float] = []

    class StepClock(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, *_: Any, **__: Any) -> None:
            step_ends.append(time.perf_counter())

    config = GRPOConfig(
        output_dir=str(out), per_device_train_batch_size=args.batch * args.group, num_generations=args.group,
        max_completion_length=args.max_tokens, max_steps=args.steps, learning_rate=args.lr,
        lr_scheduler_type="constant", warmup_steps=0, beta=0.0, temperature=1.0, use_cpu=device.type == "cpu",
        bf16=device.type == "cuda", gradient_checkpointing=True, report_to="none", save_strategy="no",
        logging_steps=1, disable_tqdm=True, use_vllm=args.trl_vllm, **({"vllm_mode": "colocate"} if args.trl_vllm else {}),
    )
    torch_dtype = torch.bfloat16 if weights == "bf16" else torch.float32
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model, dtype=torch_dtype), reward_funcs=vowel_share, args=config,
        train_dataset=data, processing_class=AutoTokenizer.from_pretrained(model), callbacks=[StepClock()],
    )
    step_ends.append(time.perf_counter())
    trainer.train()
    gaps = [b - a for a, b in zip(step_ends, step_ends[1:], strict=False)][1:] or [
        step_ends[-1] - step_ends[0]
    ]
    return {"samples_per_s": args.batch * args.group / statistics.mean(gaps)}


def measured(device: torch.device, run: Any) -> tuple[dict[str, Any], float]:
    """``run()``'s figures and its peak memory in GB (the allocator's, reset first; RSS on a CPU)."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    return run(), peak_gb(device)


def run_arch(arch: str, folder: Path, args: argparse.Namespace, device: torch.device) -> dict[str, str]:
    from transformers import AutoConfig

    from bridges.models.family_models import build_architecture

    model = build_architecture(arch, folder / arch, layers=args.layers or None)
    dtype = args.dtype or ("bf16" if device.type == "cuda" else "fp32")
    runs = folder / "runs" / arch
    makers = {"ours_ahead0": lambda: run_ours(model, runs, args, dtype, 0),
              "ours_ahead1": lambda: run_ours(model, runs, args, dtype, 1),
              "trl_amp": lambda: run_trl(model, folder / "trl_amp", args, "fp32", device),
              "trl_bf16": lambda: run_trl(model, folder / "trl_bf16", args, "bf16", device)}
    wanted = args.rows.split(",") if args.rows else [*makers][: 4 if device.type == "cuda" else 3]
    unknown = set(wanted) - set(makers) | ({"ours_ahead1", "trl_amp"} - set(wanted))
    assert not unknown, f"--rows takes {', '.join(makers)} and needs ours_ahead1 and trl_amp; not {sorted(unknown)}"
    rows = {name: measured(device, makers[name]) for name in wanted}  # in the order asked
    ours = rows["ours_ahead1"][0]
    peak = device_peak(device)
    achieved = (
        flops_per_token(AutoConfig.from_pretrained(model), ours["context"]) * ours["train_tokens"]
        / max(ours["train_s"], 1e-9)
    )
    figures = {"ratio": f"{ours['samples_per_s'] / rows['trl_amp'][0]['samples_per_s']:.2f}",
               "engine": str(ours["engine"]).replace(" ", "_")}
    for name, (row, row_peak) in rows.items():
        figures[f"{name}_samples_per_s"] = f"{row['samples_per_s']:.2f}"
        # a CPU's RSS peak is the process's: only the first run's is its own
        figures[f"{name}_peak_gb"] = f"{row_peak:.2f}" if device.type == "cuda" or name == wanted[0] else "n/a"
    # generation speed only where the trainer waits for all of it: one step ahead, it overlaps training
    synchronous = rows["ours_ahead0"][0] if "ours_ahead0" in rows else None
    figures.update(gen_tokens_per_s=f"{synchronous['gen_tokens_per_s']:.1f}" if synchronous else "n/a",
                   train_tokens_per_s=f"{ours['train_tokens_per_s']:.1f}",
                   mfu=f"{achieved / peak:.3f}" if peak else "n/a")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", action="append", help="qwen2.5-0.5b and/or qwen2.5-1.5b (default: both)")
    parser.add_argument("--layers", type=int, default=0, help="fewer decoder layers (a CPU); 0: all")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8, help="prompts per step")
    parser.add_argument("--group", type=int, default=8, help="rollouts per prompt")
    parser.add_argument("--max-tokens", type=int, default=256, help="sampled tokens per rollout, at most")
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--dtype", default=None, help="default: bf16 on CUDA, fp32 on a CPU")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--trl-vllm", action="store_true", help="TRL generates with vLLM colocated")
    parser.add_argument("--rows", default="", help="comma-separated rows (ours_ahead0, ours_ahead1, trl_amp, "
                        "trl_bf16); default: all four on CUDA, the first three on a CPU (pure bf16 means nothing there)")
    args = parser.parse_args()
    from bridges.models.hardware import resolve_device

    device = resolve_device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    figures = {}
    with tempfile.TemporaryDirectory() as folder:
        for arch in args.arch or ["qwen2.5-0.5b", "qwen2.5-1.5b"]:
            figures[arch] = run_arch(arch, Path(folder), args, device)
            print(f"{arch}: " + " ".join(f"{k}={v}" for k, v in figures[arch].items()), flush=True)
    print(f"device={name.replace(' ', '_')} " + " ".join(
        f"{arch}_{key}={value}" for arch, row in figures.items() for key, value in row.items()))


if __name__ == "__main__":
    main()
