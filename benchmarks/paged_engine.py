"""Generation tokens/s: the paged engine (transformers' continuous batching) against the hf engine.

    python benchmarks/paged_engine.py                                  # CPU: Qwen2.5-0.5B shape, 2 layers
    python benchmarks/paged_engine.py --layers 0 --requests 256 --max-tokens 512   # a GPU: all layers

Both engines get their own copy of one random-init model with Qwen2.5-0.5B's architecture (``--arch``;
``--layers`` fewer decoder layers, 0 = all) and the same burst of ``--requests`` concurrent requests,
each with its own ``max_tokens`` drawn between ``--min-tokens`` and ``--max-tokens`` (completions of
varied length, as rollouts are), temperature 1, EOS ignored so both generate the same token counts.
Rounds alternate hf, paged, hf, paged… (``--repeats`` each, after a warm-up round each); a round's figure
is generated tokens / wall seconds from the first request to the last sample. A greedy check first:
the first 8 prompts at temperature 0 through both engines, how many give the same ids (bf16 on a GPU
may differ in the last bits between the two attention paths). Last line:
``device=<name> hf_tokens_per_s=<median> paged_tokens_per_s=<median> ratio=<paged/hf median>
ratios=<each round's> greedy_same=<k>/<checked>``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def requests(tokenizer: Any, count: int, low: int, high: int) -> list[tuple[list[int], int]]:
    rng = random.Random(0)
    words = ["apple", "river", "seven", "blue", "count", "letter", "stone", "quick"]
    prompts = []
    for i in range(count):
        text = f"Task {i}: " + " ".join(rng.choice(words) for _ in range(rng.randint(8, 40)))
        prompts.append((tokenizer.encode(text, add_special_tokens=False), rng.randint(low, high)))
    return prompts


async def burst(
    engine: Any, work: list[tuple[list[int], int]], temperature: float
) -> tuple[int, float, list[Any]]:
    from bridges.envs.types import SamplingParams

    started = time.perf_counter()
    results = await asyncio.gather(*(
        engine.generate(ids, SamplingParams(max_tokens=cap, temperature=temperature, stop_token_ids=[]))
        for ids, cap in work
    ))
    seconds = time.perf_counter() - started
    return sum(len(s.token_ids) for (s,) in results), seconds, [s for (s,) in results]


def build(
    kind: str, path: str, device: str, dtype: str, cache_tokens: int, graphs: bool | None = None
) -> Any:
    from bridges.adapters.hf import HFEngine, PagedEngine
    from bridges.models.hardware import load_causal_lm, placement

    where = placement(device, dtype)
    model = load_causal_lm(path, where).requires_grad_(False)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if kind == "hf":
        return HFEngine(model, tokenizer, device=where.device, max_batch_size=1024)
    return PagedEngine(model, tokenizer, device=where.device, cache_tokens=cache_tokens, cuda_graphs=graphs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="qwen2.5-0.5b")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers (0: the architecture's own)")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--min-tokens", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto", help="auto: bf16 on CUDA, fp32 on a CPU")
    parser.add_argument(
        "--graphs", action="store_true", help="also the paged engine with CUDA graphs forced on"
    )
    args = parser.parse_args()
    import torch

    from bridges.models.family_models import build_architecture

    with tempfile.TemporaryDirectory() as folder:
        path = str(build_architecture(args.arch, Path(folder) / "model", layers=args.layers or None))
        hf = build("hf", path, args.device, args.dtype, 0)
        work = requests(hf.tokenizer, args.requests, args.min_tokens, args.max_tokens)
        cache = sum(len(ids) + cap for ids, cap in work) + 1024
        paged = build("paged", path, args.device, args.dtype, cache)
        engines = {"hf": hf, "paged": paged}
        if args.graphs:
            engines["paged_graphs"] = build("paged", path, args.device, args.dtype, cache, graphs=True)
        greedy = {k: asyncio.run(burst(e, work[:8], 0.0))[2] for k, e in engines.items()}
        same = sum(a.token_ids == b.token_ids for a, b in zip(greedy["hf"], greedy["paged"], strict=True))
        checked = len(greedy["hf"])
        rates: dict[str, list[float]] = {kind: [] for kind in engines}
        for round_ in range(args.repeats + 1):
            for kind, engine in engines.items():
                try:
                    tokens, seconds, _ = asyncio.run(burst(engine, work, 1.0))
                except Exception as exc:  # a variant that cannot run here (CUDA graphs over sdpa) is reported
                    print(f"round {round_} {kind}: failed: {type(exc).__name__}: {exc}"[:400], flush=True)
                    continue
                if round_:  # the first round of each warms up (allocator, kernels, the paged cache)
                    rates[kind].append(tokens / seconds)
                    print(
                        f"round {round_} {kind}: {tokens} tokens in {seconds:.2f} s = {tokens / seconds:.1f}/s",
                        flush=True,
                    )
        for engine in engines.values():
            engine.close()
    device = hf.device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    ratios = [p / h for p, h in zip(rates["paged"], rates["hf"], strict=True)]
    print(f"device={name.replace(' ', '_')} hf_tokens_per_s={statistics.median(rates['hf']):.1f} "
          f"paged_tokens_per_s={statistics.median(rates['paged']):.1f} ratio={statistics.median(ratios):.2f} "
          f"ratios={','.join(f'{r:.2f}' for r in ratios)} greedy_same={same}/{checked}"
          + (f" graphs_ratio={statistics.median(rates['paged_graphs']) / statistics.median(rates['hf']):.2f}"
             if rates.get("paged_graphs") else ""))


if __name__ == "__main__":
    main()
