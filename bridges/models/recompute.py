"""Activation recomputation (gradient checkpointing) by choice: none, every decoder layer, or every k-th.

Recomputing a layer in the backward pass frees its activations after the forward: every layer
(``full``) keeps only each layer's input and costs one more forward; every k-th layer keeps the
activations of the others, so memory and step time fall between ``off`` and ``full`` (Megatron's
``recompute_num_layers``, DeepSpeed's checkpoint interval). ``benchmarks/recompute.py`` prints the
memory and step time of each choice.

The setting is ``trainer.gradient_checkpointing``: ``off``, ``full`` or ``every:K``; ``true`` and
``false`` (what the key took before) mean ``full`` and ``off``. Every backend that trains the model in
this process applies it the same way, through ``apply_recompute``: transformers' own checkpointing
(non-reentrant, so frozen inputs such as LoRA's work and FSDP can wrap the layers) switched on, then
off again on the decoder layers the stride skips.
"""

from __future__ import annotations

from typing import Any

from bridges.runtime.errors import ConfigError

KEY = "trainer.gradient_checkpointing"
OFF, FULL, EVERY = "off", "full", "every:"
_SYNONYMS = {"false": OFF, "off": OFF, "no": OFF, "true": FULL, "full": FULL, "yes": FULL}


def recompute_stride(setting: Any, key: str = KEY) -> int:
    """0 (off), 1 (every layer) or K (every K-th layer) for a setting; a bad one is one sentence."""
    text = str(setting).strip().lower()
    if text in _SYNONYMS:
        return 0 if _SYNONYMS[text] == OFF else 1
    if text.startswith(EVERY):
        count = text[len(EVERY) :]
        if count.isdigit() and int(count) >= 1:
            return int(count)
    raise ConfigError(f"{key} must be off, full or every:K (K a whole number of layers, at least 1); got '{setting}'.")


def describe(stride: int) -> str:
    return OFF if stride == 0 else FULL if stride == 1 else f"{EVERY}{stride}"


def checkpointed_layers(model: Any) -> list[Any]:
    """The model's decoder layers that transformers can recompute, in order."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def apply_recompute(model: Any, stride: int) -> int:
    """Recompute every ``stride``-th decoder layer of ``model`` (the first, the (K+1)-th, ...) in the
    backward pass; 0 leaves the model as it is. Returns how many decoder layers are recomputed (0 for a
    model that checkpoints in its own way, which only ``full`` reaches)."""
    if stride == 0:
        return 0
    layers = checkpointed_layers(model)
    if stride > 1 and not layers:
        raise ConfigError(
            f"{KEY}=every:{stride} recomputes chosen decoder layers, and this model's layers are not "
            "transformers' GradientCheckpointingLayer; use full."
        )
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    for index, layer in enumerate(layers):
        layer.gradient_checkpointing = index % stride == 0
    return sum(1 for layer in layers if layer.gradient_checkpointing)
