"""Decode speed of every generation path at one model shape: ms per decode step, tokens/s, peak memory.

    python benchmarks/decode_probe.py                                   # a GPU: Qwen2.5-0.5B, 64/128/256 rows x 256 tokens
    python benchmarks/decode_probe.py --layers 1 --rows 8 --tokens 8    # CPU (CI): the same paths, small

The paths, each over its own copy of one random-init model (``--arch``, ``--layers``: fewer decoder layers):
- ``hf_eager``: the hf engine's eager loop (``adapters/hf/decode.py``: a growing cache, a host sync a step);
- ``hf_graphs``: its fixed-shape decode (``adapters/hf/static_decode.py``), each step a replayed CUDA graph
  (on a CPU the same path without graphs: ``hf_static``);
- ``hf_generate``: ``model.generate`` as TRL 1.16 calls it (sampling, a DynamicCache, no compile);
- ``paged_graphs``: transformers' continuous batching (the paged engine) with CUDA graphs asked for.
Every row samples at temperature 1 from a prompt of 24-60 tokens, up to ``--tokens`` tokens (EOS kept: a
random model rarely samples it; tokens/s counts what was generated). Per path and row count: one warm-up
round at that shape (graphs captured, kernels chosen), then ``--repeats`` timed rounds; ms per step is a
round's wall time over its longest sample. ``hf_graphs`` also counts the host synchronisations CUDA
reports during its timed rounds (``torch.cuda.set_sync_debug_mode``; goal 0 inside a step: the host
waits only for the step before). Last line: ``device=<name> <path>_<rows>_tokens_per_s=…
<path>_<rows>_ms_per_step=… <path>_<rows>_peak_gb=… hf_graphs_syncs=…`` (goal: ``hf_graphs_64_tokens_per_s``
>= 10,000 on one H100 or H200 at Qwen2.5-0.5B).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch

PATHS = ("hf_eager", "hf_graphs", "hf_generate", "paged_graphs")


def prompts(tokenizer: Any, count: int) -> list[list[int]]:
    rng = random.Random(0)
    words = ["apple", "river", "seven", "blue", "count", "letter", "stone", "quick", "north", "paper"]
    return [tokenizer.encode(" ".join(rng.choice(words) for _ in range(rng.randint(24, 60))),
                             add_special_tokens=False) for _ in range(count)]


def engine_for(path: str, model_path: str, device: str, dtype: str, rows: int) -> Any:
    from transformers import AutoTokenizer

    from bridges.adapters.hf import HFEngine, PagedEngine
    from bridges.models.hardware import load_causal_lm, placement

    where = placement(device, dtype)
    model = load_causal_lm(model_path, where).requires_grad_(False)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if path == "hf_generate":
        return model.eval(), tokenizer
    if path == "paged_graphs":
        return PagedEngine(model, tokenizer, device=where.device, max_batch_size=rows, cuda_graphs=True,
                           cache_tokens=rows * 512)
    static = path == "hf_graphs"
    return HFEngine(model, tokenizer, device=where.device, max_batch_size=rows, static_cache=static,
                    cuda_graphs=static)


async def engine_round(engine: Any, work: list[list[int]], tokens: int) -> tuple[int, int]:
    """Generated tokens and the longest sample of one burst (every row at once)."""
    from bridges.envs.types import SamplingParams

    params = SamplingParams(max_tokens=tokens, temperature=1.0, seed=0)
    samples = await asyncio.gather(*(engine.generate(ids, params) for ids in work))
    lengths = [len(s.token_ids) for (s,) in samples]
    return sum(lengths), max(lengths)


def generate_round(model_and_tokenizer: Any, work: list[list[int]], tokens: int) -> tuple[int, int]:
    """``model.generate`` the way TRL's GRPOTrainer calls it: left-padded prompts, sampling, a DynamicCache."""
    model, tokenizer = model_and_tokenizer
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    width = max(map(len, work))
    device = next(model.parameters()).device
    ids = torch.tensor([[pad] * (width - len(w)) + w for w in work], device=device)
    mask = torch.tensor([[0] * (width - len(w)) + [1] * len(w) for w in work], device=device)
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,
                             top_p=1.0, max_new_tokens=tokens, pad_token_id=pad)
    new = out[:, width:]
    lengths = (new != pad).sum(-1).tolist()
    return int(sum(lengths)), int(new.shape[1])


def timed(run: Any, device: torch.device, count_syncs: bool) -> tuple[float, int, int, int]:
    """Seconds, generated tokens, steps (the longest sample) and host syncs CUDA reported for one round."""
    syncs = 0
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        if count_syncs:
            torch.cuda.set_sync_debug_mode("warn")
    started = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tokens, steps = run()
        if device.type == "cuda":
            torch.cuda.set_sync_debug_mode("default")
            torch.cuda.synchronize(device)
    seconds = time.perf_counter() - started
    syncs = sum("synchroniz" in str(w.message) for w in caught)
    return seconds, tokens, steps, syncs


def probe_path(path: str, model_path: str, args: argparse.Namespace, rows: int) -> dict[str, float]:
    engine = engine_for(path, model_path, args.device, args.dtype, rows)
    device = engine[0].device if path == "hf_generate" else engine.device
    tokenizer = engine[1] if path == "hf_generate" else engine.tokenizer
    work = prompts(tokenizer, rows)

    def one() -> tuple[int, int]:
        if path == "hf_generate":
            return generate_round(engine, work, args.tokens)
        return asyncio.run(engine_round(engine, work, args.tokens))

    one()  # warm-up at this shape: graphs captured, kernels chosen
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    rounds = [timed(one, device, path == "hf_graphs") for _ in range(args.repeats)]
    if path != "hf_generate":
        engine.close()
    seconds = statistics.median(r[0] for r in rounds)
    tokens, steps = rounds[0][1], max(r[2] for r in rounds)
    peak = torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else float("nan")
    return {"tokens_per_s": tokens / seconds, "ms_per_step": 1000 * seconds / max(steps, 1), "peak_gb": peak,
            "syncs": float(sum(r[3] for r in rounds))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="qwen2.5-0.5b")
    parser.add_argument("--layers", type=int, default=0, help="decoder layers (0: the architecture's own)")
    parser.add_argument("--rows", default="64,128,256", help="row counts, comma-separated")
    parser.add_argument("--tokens", type=int, default=256, help="sampled tokens per row, at most")
    parser.add_argument("--repeats", type=int, default=1, help="timed rounds after the warm-up, per shape")
    parser.add_argument("--paths", default=",".join(PATHS))
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto", help="auto: bf16 on CUDA, fp32 on a CPU")
    args = parser.parse_args()
    from bridges.models.family_models import build_architecture
    from bridges.models.hardware import resolve_device

    device = resolve_device(args.device)
    figures: dict[str, str] = {}
    syncs = 0.0
    with tempfile.TemporaryDirectory() as folder:
        model_path = str(build_architecture(args.arch, Path(folder) / "model", layers=args.layers or None))
        for path in args.paths.split(","):
            name = "hf_static" if path == "hf_graphs" and device.type != "cuda" else path
            for rows in map(int, args.rows.split(",")):
                try:
                    result = probe_path(path, model_path, args, rows)
                except Exception as exc:  # a path that cannot run here is reported, the others go on
                    print(f"{name} {rows} rows: failed: {type(exc).__name__}: {exc}"[:400], flush=True)
                    continue
                syncs += result["syncs"] if path == "hf_graphs" else 0
                print(f"{name} {rows} rows: {result['tokens_per_s']:.0f} tokens/s, {result['ms_per_step']:.2f} "
                      f"ms/step, peak {result['peak_gb']:.2f} GB", flush=True)
                for key in ("tokens_per_s", "ms_per_step", "peak_gb"):
                    figures[f"{name}_{rows}_{key}"] = f"{result[key]:.2f}" if result[key] == result[key] else "n/a"
    label = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"device={label.replace(' ', '_')} " + " ".join(f"{k}={v}" for k, v in figures.items())
          + f" hf_graphs_syncs={int(syncs) if device.type == 'cuda' else 'n/a'}")  # only CUDA counts them
    sys.stdout.flush()


if __name__ == "__main__":
    main()
