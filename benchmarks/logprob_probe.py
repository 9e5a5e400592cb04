"""Whether the trainer's chunked logprobs are used on this device: the largest gap between the chunked
and plain paths on a Qwen2.5-0.5B architecture (random weights) in fp32 and bf16, and the probe's verdict.

    python benchmarks/logprob_probe.py [--arch qwen2.5-0.5b] [--layers N]   # --arch tiny: the embedded model
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="qwen2.5-0.5b")
    parser.add_argument("--layers", type=int, default=None)
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM

    from bridges.models.family_models import build_architecture
    from bridges.models.hardware import resolve_device
    from bridges.models.tiny import resolve_model_path
    from bridges.models.token_logprobs import chunked_matches_plain, token_logprobs

    device = resolve_device("auto")
    pairs = {"device": device.type}
    with tempfile.TemporaryDirectory() as folder:
        path = (resolve_model_path("tiny") if args.arch == "tiny"
                else build_architecture(args.arch, Path(folder) / "model", layers=args.layers))
        for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
            ids = torch.randint(0, model.config.vocab_size, (4, 64), generator=torch.Generator().manual_seed(0)).to(device)
            ones, targets = torch.ones_like(ids), torch.roll(ids, -1, dims=1)
            with torch.no_grad():
                gap = (token_logprobs(model, ids, ones, targets, ones, chunked=False)
                       - token_logprobs(model, ids, ones, targets, ones, chunk_tokens=3)).abs().max()
            pairs[f"{name}_max_gap"] = f"{float(gap):.2e}"
            pairs[f"{name}_chunked"] = str(chunked_matches_plain(model, model.config.vocab_size)).lower()
            del model
    print(" ".join(f"{k}={v}" for k, v in pairs.items()))


if __name__ == "__main__":
    main()
