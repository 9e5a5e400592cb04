"""Optional fused kernels for the training forward, behind one setting: ``trainer.kernels``.

- ``eager`` (default): the model as transformers runs it.
- ``compile``: each decoder layer through ``torch.compile`` (``nn.Module.compile``, dynamic shapes, as
  sequence lengths change every step). Inductor fuses the layer's elementwise work (RMSNorm, SwiGLU,
  the rotary embedding, residual adds) into few kernels; the matmuls and attention stay the library's.
  The first steps pay the compilation (tens of seconds on a CPU); the decoder layers share one code
  object, so the layers compile once, not once each.

Left out: Liger's Triton kernels (CUDA only, and nothing here could run or test them; its fused linear
cross-entropy would add little, as our logprobs never hold the logits, ``token_logprobs``).

``compile`` gives the same logprobs and gradients as ``eager`` within float tolerance
(``tests/grpo/test_fused.py``). The engine's copy is never compiled: it decodes one
token at a time, where a compiled layer would recompile for each new shape.
"""

from __future__ import annotations

from typing import Any

from bridges.models.recompute import checkpointed_layers
from bridges.runtime.errors import ConfigError

KERNELS = ("eager", "compile")


def apply_kernels(model: Any, choice: str) -> int:
    """Apply ``choice`` to ``model`` in place; returns how many decoder layers were changed."""
    if choice == "eager":
        return 0
    layers = checkpointed_layers(model)
    if not layers:
        raise ConfigError(
            "trainer.kernels=compile compiles the decoder layers, and this model's layers are not "
            "transformers' GradientCheckpointingLayer; use eager."
        )
    for layer in layers:
        layer.compile(dynamic=True)
    return len(layers)
