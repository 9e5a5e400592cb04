"""Runs inside each vLLM worker process (``worker_extension_cls``): receives new full weights.

vLLM's model classes accept Hugging Face parameter names in ``load_weights`` and do their own
fusing (qkv, gate/up), so the trainer can send its ``state_dict`` unchanged. Tensors travel by
pickling through ``collective_rpc``; that is simple and fine for small and medium models. For
very large models an NCCL broadcast is the faster path and can be added behind this same method.
"""

from __future__ import annotations

from typing import Any


class WeightSyncExtension:
    """Mixed into vLLM's worker class; ``self.model_runner`` is the worker's model runner."""

    def update_weights_from_state(self, named_tensors: list[tuple[str, Any]]) -> int:
        device = next(self.model_runner.model.parameters()).device  # type: ignore[attr-defined]
        weights = [(name, tensor.to(device)) for name, tensor in named_tensors]
        self.model_runner.model.load_weights(weights=weights)  # type: ignore[attr-defined]
        return len(weights)
