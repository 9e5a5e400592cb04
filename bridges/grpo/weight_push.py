"""The trainer's side of a weight push: the policy's tensors as payloads a ``bridges.serve`` takes.

A server holds a plain model (no peft wrapper), so names are the base model's (``base_name``, and the
adapter's factors by ``lora_payload``, live in ``bridges.models.weight_payload``: the in-process engine
merges them the same way). Full fine-tuning sends
the trained tensors. A LoRA policy sends its adapter as factors (``<layer>.lora_A``/``.lora_B`` and
each layer's scaling; the server merges), except the first push to a server, which also carries the
whole base model: the server's base then equals the trainer's whatever checkpoint it loaded, and a
factor is only meaningful against the base it was trained on.
"""

from __future__ import annotations

from typing import Any

import torch

from bridges.models.weight_payload import Payload, base_name, lora_payload


def full_payload(state: dict[str, torch.Tensor], version: int, run: str = "") -> Payload:
    """Whole tensors under their base names (a LoRA policy's factors left out). A tensor that shares
    its storage with one already named (a tied ``lm_head``) is left out too: the server's copy is tied
    the same way and follows, and sending it again would add the vocabulary matrix to every push."""
    tensors, seen = {}, set()
    for name, value in state.items():
        if ".lora_" in name:
            continue
        storage = (value.device, value.untyped_storage().data_ptr(), value.storage_offset(), value.shape)
        if storage not in seen:
            seen.add(storage)
            tensors[base_name(name)] = value
    return Payload("full", version, tensors, run=run)


def payloads(
    state: dict[str, Any], scalings: dict[str, float], version: int, whole: bool, run: str = ""
) -> list[Payload]:
    """What one server is sent for ``version`` of ``run``: a LoRA policy's factors (after the whole base
    model when ``whole``: the server's first push), or the full tensors."""
    if not scalings:
        return [full_payload(state, version, run)]
    parts = [lora_payload(state, scalings, version, run)]
    return [full_payload(state, version, run), *parts] if whole else parts
