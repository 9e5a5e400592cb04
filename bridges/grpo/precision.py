"""Half-precision training with fp32 master weights: what the model computes in, what the optimizer keeps.

The scheme (``trainer.dtype=bf16|fp16``): the model's parameters are stored in the half dtype, so the
trainer's forward and the engine that samples (a copy of the same half weights) compute with the very
same numbers, and the first importance ratio of a run is 1 up to kernel differences. The optimizer
never sees them: ``MasterWeights`` keeps an fp32 copy of every trainable half parameter, the
gradients are moved onto those copies (in fp32) after the backward, AdamW steps them with fp32
moments, and the result is rounded back into the model. Logprobs and the loss are always computed in
fp32 (``bridges.models.token_logprobs``). fp16's narrow range also needs loss scaling: ``scaler`` is a
dynamic ``GradScaler`` for fp16 and a no-op otherwise.

Parameters that are already fp32 (every one at ``dtype=fp32``; peft's LoRA matrices, which it keeps in
fp32 over a half base model; FSDP2's sharded parameters, whose own mixed-precision policy casts them
for compute) are their own master: nothing is copied for them.
"""

from __future__ import annotations

from typing import Any

import torch


class MasterWeights:
    """fp32 master copies of a model's trainable half-precision parameters."""

    def __init__(self, model: torch.nn.Module) -> None:
        trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.pairs = [
            (name, p, torch.nn.Parameter(p.detach().to(torch.float32).clone())) for name, p in trainable
            if p.dtype != torch.float32
        ]  # fmt: skip
        self.params = [p for _, p in trainable if p.dtype == torch.float32] + [m for _, _, m in self.pairs]
        """What the optimizer steps: the fp32 trainable parameters, then the masters."""

    def grads_to_master(self) -> None:
        """Move each half gradient onto its master (as fp32), freeing the half one as it goes."""
        for _, model_param, master in self.pairs:
            if model_param.grad is not None:
                master.grad = model_param.grad.to(torch.float32)
                model_param.grad = None

    @torch.no_grad()
    def master_to_model(self) -> None:
        """Round the stepped masters back into the model's half parameters."""
        for _, model_param, master in self.pairs:
            model_param.copy_(master)

    def named_state(self) -> dict[str, torch.Tensor]:
        """The masters by parameter name, for a checkpoint (the half weights alone lost their low bits)."""
        return {name: master.detach() for name, _, master in self.pairs}

    @torch.no_grad()
    def load_named_state(self, tensors: dict[str, torch.Tensor]) -> None:
        """Masters (and the half weights rounded from them) from a checkpoint's fp32 tensors."""
        for name, _, master in self.pairs:
            if name in tensors:
                master.copy_(tensors[name])
        self.master_to_model()


def make_optimizer(params: list[torch.nn.Parameter], lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW over fp32 parameters. The fused kernel (CPU and CUDA) holds no temporaries; the default
    multi-tensor path would hold some the size of every parameter, the per-tensor one the size of the
    largest (at a 152k vocabulary, the embedding). Sharded (FSDP) parameters take the per-tensor path."""
    from torch.distributed.tensor import DTensor

    if any(isinstance(p, DTensor) for p in params):
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, foreach=False)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True)


def make_scaler(dtype: torch.dtype, device: torch.device) -> Any:
    """Dynamic loss scaling for fp16 (gradients would underflow); disabled (a pass-through) otherwise."""
    return torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
