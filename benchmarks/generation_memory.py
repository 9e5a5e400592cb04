"""Peak memory of one generation batch in the hf engine, against its floor, at several lengths.

    python benchmarks/generation_memory.py [--layers 4] [--rows 64] [--prompt 30] [--lengths 128,256,512]

A random-init model with Qwen2.5-0.5B's width and vocabulary (``--layers`` decoder layers; 4 on a CPU,
all on CUDA) is loaded as the trainer loads its engine's copy (``load_policy(..., for_sampling=True)``,
with ``trainer.gradient_checkpointing=true`` set, which the copy must ignore) and samples ``--rows``
rows of ``--prompt`` random prompt tokens through the engine's decode loop (``generate_batch``), every
row running to ``max_tokens`` (no stop token), once per length.

The floor of a batch is what generation cannot avoid holding: the weights and the KV cache of every
row at full length (rows x (prompt + max_tokens) x layers x 2 x kv_heads x head_dim). Peak memory is
the allocator's on CUDA and, on a CPU, the bytes of live tensor storages
(``bridges.models.tensor_memory``). The last line is ``key=value`` pairs; goal: ``gen_peak_floor_ratio``
(the worst length) <= 1.3. ``growth_ratio`` is (peak at the longest - peak at the middle) / (peak at the
middle - peak at the shortest) over the extra tokens' share: 1 for memory linear in the length, about
3 for the quadratic growth a decode loop that records autograd graphs shows.
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


def kv_bytes(config: Any, rows: int, tokens: int, dtype: torch.dtype) -> int:
    """The KV cache of ``rows`` sequences of ``tokens`` tokens (keys and values, every layer)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    per_token = config.num_hidden_layers * 2 * kv_heads * head_dim
    return rows * tokens * per_token * torch.tensor([], dtype=dtype).element_size()


def measure(model: Any, tokenizer: Any, rows: int, prompt: int, max_tokens: int, device: torch.device) -> dict[str, float]:
    """Peak bytes of one batch that runs every row to ``max_tokens``, and its floor."""
    from bridges.adapters.hf.decode import RowRequest, accepts_logits_to_keep, generate_batch
    from bridges.envs.types import SamplingParams

    rng = random.Random(0)
    vocab = model.get_input_embeddings().weight.shape[0]
    params = SamplingParams(max_tokens=max_tokens, temperature=1.0)
    requests = [RowRequest([rng.randrange(3, vocab) for _ in range(prompt)], params, max_tokens, seed=i,
                           stop_token_ids=frozenset()) for i in range(rows)]
    existing = [*model.parameters(), *model.buffers()]
    results: list[Any] = []
    peak = peak_bytes(lambda: results.extend(generate_batch(model, tokenizer, requests, pad_token_id=0, device=device,
                                                            logits_to_keep=accepts_logits_to_keep(model))),
                      existing, device)
    assert all(len(r.token_ids) == max_tokens for r in results), "every row runs to max_tokens"
    weights = sum(t.numel() * t.element_size() for t in {id(t): t for t in existing}.values())
    dtype = next(model.parameters()).dtype
    floor = weights + kv_bytes(model.config, rows, prompt + max_tokens, dtype)
    return {"peak": peak, "floor": floor}


def load_engine_copy(model_path: str, device: str, dtype: str) -> tuple[Any, Any, torch.device]:
    """The engine's copy of the policy, built as the trainer builds it."""
    from bridges.grpo.policy import load_policy
    from bridges.models.hardware import placement
    from bridges.runs.config import parse_config
    from bridges.runs.train_config import TrainConfig

    config = parse_config(TrainConfig, [f"model={model_path}", f"trainer.dtype={dtype}", f"trainer.device={device}",
                                        "trainer.gradient_checkpointing=true"])
    where = placement(device, dtype)
    model, tokenizer = load_policy(config, where, for_sampling=True)
    return model, tokenizer, where.device


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="qwen2.5-0.5b")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default: 4 on a CPU, all on CUDA)")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=30)
    parser.add_argument("--lengths", default="128,256,512", help="max_tokens values, shortest first")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args()
    from bridges.models.family_models import build_architecture
    from bridges.models.hardware import resolve_device

    device_type = resolve_device(args.device).type
    layers = args.layers or (None if device_type == "cuda" else 4)
    lengths = [int(n) for n in args.lengths.split(",")]
    ratios: dict[int, float] = {}
    peaks: dict[int, float] = {}
    with tempfile.TemporaryDirectory() as folder:
        path = str(build_architecture(args.arch, Path(folder) / "model", layers=layers))
        model, tokenizer, device = load_engine_copy(path, args.device, args.dtype)
        for max_tokens in lengths:
            m = measure(model, tokenizer, args.rows, args.prompt, max_tokens, device)
            ratios[max_tokens], peaks[max_tokens] = m["peak"] / m["floor"], m["peak"]
            print(f"max_tokens {max_tokens:5d}: peak {m['peak'] / MB:8.1f} MB   floor {m['floor'] / MB:8.1f} MB   "
                  f"ratio {ratios[max_tokens]:.3f}", flush=True)
    pairs: dict[str, Any] = {"device": device.type, "dtype": str(next(model.parameters()).dtype).split(".")[-1],
                             "arch": args.arch, "layers": layers or "all", "rows": args.rows,
                             **{f"ratio_{n}": f"{r:.3f}" for n, r in ratios.items()},
                             "gen_peak_floor_ratio": f"{max(ratios.values()):.3f}"}
    if len(lengths) >= 3:
        short, middle, long = lengths[0], lengths[len(lengths) // 2], lengths[-1]
        share = (long - middle) / (middle - short)
        pairs["growth_ratio"] = f"{(peaks[long] - peaks[middle]) / (peaks[middle] - peaks[short]) / share:.3f}"
    print(" ".join(f"{k}={v}" for k, v in pairs.items()))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
