"""Half-precision training with fp32 master weights: what the model computes in, what the optimizer keeps.

The scheme (``trainer.dtype=bf16|fp16``): the model's parameters are stored in the half dtype, so the
trainer's forward and the engine that samples (a copy of the same half weights) compute with the very
same numbers, and the first importance ratio of a run is 1 up to kernel differences. The optimizer
never sees them: ``MasterWeights`` keeps an fp32 copy of every trainable half parameter. Gradients are
summed in fp32 on those copies: each half gradient is added onto its master the moment autograd has
accumulated it (a post-accumulate hook) and freed, so micro-batches add up in fp32 and no two
gradients of one parameter exist at once; the chunked head writes its gradient straight into the
master's (``fp32_grad``). AdamW steps the masters with fp32 moments, and the result is rounded back
into the model. Logprobs and the loss are always fp32 (``bridges.models.token_logprobs``).

Under FSDP (``parallel.shard``) the parameters themselves are fp32 and sharded, FSDP2's
mixed-precision policy gathers them in the half dtype for compute and reduces gradients in fp32: they
are their own masters (as every parameter is at ``dtype=fp32``, and peft's fp32 LoRA matrices are).

fp16's narrow range also needs loss scaling. ``DynamicLossScale`` decides overflow from the step's
global gradient norm, which every process computes identically (after ddp's all-reduce, or FSDP's
sharded norm), so the processes skip the same steps and keep the same scale; a per-process overflow
flag (``torch.amp.GradScaler`` over shards) would let them drift apart. Its state is checkpointed.
"""

from __future__ import annotations

from typing import Any

import torch


class MasterWeights:
    """fp32 master copies of a model's trainable half-precision parameters, and their fp32 gradients."""

    def __init__(self, model: torch.nn.Module) -> None:
        trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.pairs = [
            (name, p, torch.nn.Parameter(p.detach().to(torch.float32).clone())) for name, p in trainable
            if p.dtype != torch.float32
        ]
        self.params = [p for _, p in trainable if p.dtype == torch.float32] + [m for _, _, m in self.pairs]
        """What the optimizer steps: the fp32 trainable parameters, then the masters."""
        self._master_of = {id(p): m for _, p, m in self.pairs}
        for _, model_param, _ in self.pairs:
            model_param.register_post_accumulate_grad_hook(self._to_master)

    def _to_master(self, model_param: torch.Tensor) -> None:
        """Autograd has accumulated a half gradient: add it onto the master in fp32 and free it."""
        if model_param.grad is not None:
            master = self._master_of[id(model_param)]
            if master.grad is None:
                master.grad = model_param.grad.to(torch.float32)
            else:
                master.grad.add_(model_param.grad)
            model_param.grad = None

    def fp32_grad(self, model_param: torch.Tensor) -> torch.Tensor | None:
        """The fp32 gradient buffer of a half parameter's master (made on first use), for code that
        writes a gradient itself; None for a parameter that is its own master."""
        master = self._master_of.get(id(model_param))
        if master is None:
            return None
        if master.grad is None:
            master.grad = torch.zeros_like(master)
        return master.grad

    def grads_to_master(self) -> None:
        """Move any half gradient still on the model (one written outside autograd) onto its master."""
        for _, model_param, _ in self.pairs:
            self._to_master(model_param)

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


class DynamicLossScale:
    """Dynamic loss scaling (fp16): the loss is multiplied by ``value`` before the backward and the
    gradients divided by it after; an overflowing step halves it, ``interval`` clean steps double it.
    Disabled (value 1, no-ops) for every other dtype. Overflow is the caller's global verdict."""

    def __init__(self, enabled: bool, init: float = 2.0**16, interval: int = 2000) -> None:
        self.enabled = enabled
        self.value = init if enabled else 1.0
        self.interval = interval
        self.clean_steps = 0

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.value if self.enabled else loss

    @torch.no_grad()
    def unscale_(self, params: list[torch.nn.Parameter]) -> None:
        if self.enabled:
            for param in params:
                if param.grad is not None:
                    param.grad.mul_(1.0 / self.value)

    def update(self, overflow: bool) -> None:
        if not self.enabled:
            return
        if overflow:
            self.value, self.clean_steps = max(self.value * 0.5, 1.0), 0
        else:
            self.clean_steps += 1
            if self.clean_steps >= self.interval:
                self.value, self.clean_steps = self.value * 2.0, 0

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value, "clean_steps": self.clean_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.enabled and state:
            self.value, self.clean_steps = float(state["value"]), int(state["clean_steps"])


def make_optimizer(params: list[torch.nn.Parameter], lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW over fp32 parameters. The fused kernel (CPU and CUDA) holds no temporaries; the default
    multi-tensor path would hold some the size of every parameter, the per-tensor one the size of the
    largest (at a 152k vocabulary, the embedding). Sharded (FSDP) parameters take the per-tensor path."""
    from torch.distributed.tensor import DTensor

    if any(isinstance(p, DTensor) for p in params):
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, foreach=False)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True)


def make_scaler(dtype: torch.dtype, device: torch.device | None = None) -> DynamicLossScale:
    """Dynamic loss scaling for fp16 (gradients would underflow); disabled (a pass-through) otherwise."""
    return DynamicLossScale(enabled=dtype == torch.float16)
