"""Seconds per weight push into a running ``bridges.serve``: HTTP bodies against a collective channel.

    python benchmarks/weight_push.py [--arch qwen2.5-0.5b] [--layers 4] [--channels http,gloo] [--device auto]

A random-init model with the architecture's shapes (``--layers`` fewer decoder layers on a CPU) is
served by an hf engine in this process (``serve_in_thread``); a trainer-side copy, perturbed each
round so that every push changes the weights, is pushed whole through each channel in turn, three
rounds each, measured as wall seconds until the server has applied it. The first push of a
collective channel also opens its pair; that round is reported apart (``join``). Prints one line:
``<channel>_s=<median> ... <channel>_vs_http=<ratio>``. On a GPU: ``--device cuda --channels http,nccl``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROUNDS = 3
KEY = "benchmark-weights-key"


async def measure(server: Any, engine: Any, policy: Any, channel: str) -> tuple[float, float]:
    """(median seconds per push after the first, seconds of the first push)."""
    from bridges.grpo.push_channels import CollectiveChannel, HttpChannel
    from bridges.grpo.weight_push import payloads

    headers = {"Authorization": f"Bearer {KEY}"}
    sender = HttpChannel(headers) if channel == "http" else CollectiveChannel(channel, headers)
    times = []
    for _ in range(ROUNDS + 1):
        with torch.no_grad():
            next(policy.parameters()).add_(1e-3)
        version = int(engine.weight_version) + 1
        started = time.perf_counter()
        await sender.send(server.url, payloads(dict(policy.state_dict()), {}, version, whole=True))
        times.append(time.perf_counter() - started)
        assert int(engine.weight_version) == version, "the push did not land"
    sender.close()
    return statistics.median(times[1:]), times[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="qwen2.5-0.5b")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default: 4 on a CPU, all on CUDA)")
    parser.add_argument("--channels", default="http,gloo")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from bridges.adapters.hf import HFEngine
    from bridges.client import EngineClient
    from bridges.models.family_models import build_architecture
    from bridges.models.hardware import resolve_device
    from bridges.server.app import WeightUpdates, serve_in_thread

    device = resolve_device(args.device)
    layers = args.layers or (None if device.type == "cuda" else 4)
    with tempfile.TemporaryDirectory() as folder:
        path = build_architecture(args.arch, Path(folder) / "model", layers=layers)
        tokenizer = AutoTokenizer.from_pretrained(path)
        served = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(device).eval()
        policy = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(device)
    engine = HFEngine(served, tokenizer)
    figures: dict[str, str] = {"device": device.type, "arch": args.arch, "layers": str(layers or "all"),
                               "mb": f"{sum(p.numel() * p.element_size() for p in policy.parameters()) / 2**20:.0f}"}
    updates = WeightUpdates(KEY, served)
    with serve_in_thread(EngineClient(engine, model_name="bench"), updates=updates) as server:
        for channel in args.channels.split(","):
            seconds, first = asyncio.run(measure(server, engine, policy, channel))
            figures[f"{channel}_s"], figures[f"{channel}_first_s"] = f"{seconds:.3f}", f"{first:.3f}"
    engine.close()
    if "http_s" in figures:
        for channel in args.channels.split(","):
            if channel != "http":
                figures[f"{channel}_vs_http"] = f"{float(figures[f'{channel}_s']) / float(figures['http_s']):.3f}"
    print(" ".join(f"{k}={v}" for k, v in figures.items()))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
