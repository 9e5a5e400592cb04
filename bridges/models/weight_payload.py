"""New weights as bytes: what a trainer sends an inference server, and how the server applies them.

A payload is one safetensors file: the tensors, and in its metadata the ``weight_version`` they
become, the trainer run that numbers them (``run``: versions are ordered within a run only, so a
resumed or new trainer is not refused by a server holding another run's higher number) and their kind. ``full``: tensors by the model's own names (any subset), copied in.
``lora``: for each adapted linear layer ``<module>``, ``<module>.lora_A`` and ``<module>.lora_B``
with its scaling; the server computes ``W = W_base + scaling · B @ A`` on its own copy. Why LoRA
travels as factors: an adapter is a few MB where the merged layers are the size of the model, and
the remote-LoRA setups this serves (a trainer on one GPU, servers elsewhere) are bandwidth-bound.

Invariant (``LoraMerger``): a layer's base is the last full tensor the server received for it (or
what it loaded at start), never a merged one, so applying adapter k+1 replaces adapter k instead of
adding to it.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

import torch

from bridges.runtime import json_rules
from bridges.runtime.errors import BridgesError, require_extra

KINDS = ("full", "lora")
MAX_VERSION = 10**12  # a step count: no trainer gets near it, and a push cannot pin a server past it
RUN_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


class WeightPayloadError(BridgesError, ValueError):
    """A payload that cannot be applied, in one sentence (the server answers it with a 4xx)."""


@dataclass
class Payload:
    kind: str
    version: int
    tensors: dict[str, torch.Tensor]
    scaling: dict[str, float] = field(default_factory=dict)  # lora: per module
    run: str = ""  # the trainer run that numbers ``version`` ("": none said)


def checked_version(value: Any) -> int:
    """A weight version as sent (ASCII digits, or a JSON integer), at most ``MAX_VERSION``."""
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 13:
        value = int(value)
    if type(value) is not int or not 0 <= value <= MAX_VERSION:
        raise WeightPayloadError(
            f"a weight version is a whole number from 0 to {MAX_VERSION} in ASCII digits, not {str(value)[:40]!r}."
        )
    return value


def checked_run(value: Any) -> str:
    """A run id as sent: empty, or 1-64 of ``[A-Za-z0-9._-]``."""
    if value in (None, ""):
        return ""
    if not isinstance(value, str) or not RUN_ID.fullmatch(value):
        raise WeightPayloadError(f"a push's run id is 1-64 of A-Z a-z 0-9 . _ -, not {str(value)[:40]!r}.")
    return value


def checked_scaling(raw: Any) -> dict[str, float]:
    """Per-layer LoRA scalings: a JSON object of finite numbers (an integer past float's range, 10**400,
    is refused like an infinity)."""
    try:
        scaling = {str(k): float(v) for k, v in dict(raw or {}).items()}
    except (ValueError, TypeError, OverflowError):
        raise WeightPayloadError("the payload's scaling must be a JSON object of finite numbers.") from None
    if not all(math.isfinite(v) for v in scaling.values()):
        raise WeightPayloadError("the payload's scaling holds NaN or an infinite number.")
    return scaling


def check_values(tensors: dict[str, torch.Tensor], state: dict[str, torch.Tensor] | None) -> None:
    """Every tensor finite in the dtype the model keeps it in (``state``'s; as sent without it), and floating
    point where the model's is: a NaN, an infinity or an integer tensor cast into a weight would break every
    request after it, and a float64 1e300 is finite only until it becomes the model's float32."""
    for name, value in tensors.items():
        own = state.get(name) if state is not None else None
        floating = own.is_floating_point() if own is not None else True
        if value.is_floating_point() != floating:
            kind = "floating point" if floating else str(own.dtype if own is not None else "")
            raise WeightPayloadError(
                f"the payload's '{name[:160]}' is {str(value.dtype).removeprefix('torch.')}; this model's is {kind}."
            )
        target = own.dtype if floating and own is not None else value.dtype
        kept = value.to(target) if target != value.dtype else value
        if floating and not bool(torch.isfinite(kept).all()):
            where = f" once cast to the model's {str(target).removeprefix('torch.')}" if kept is not value else ""
            raise WeightPayloadError(f"the payload's '{name[:160]}' holds NaN or infinite values{where}.")


def encode(payload: Payload) -> bytes:
    """One safetensors file; a tensor that shares storage with another (tied embeddings) is copied, so
    each name carries its own bytes (safetensors refuses shared storage)."""
    from safetensors.torch import save

    metadata = {"kind": payload.kind, "version": str(payload.version), "scaling": json.dumps(payload.scaling),
                "run": payload.run}
    tensors, seen = {}, set()
    for name, value in payload.tensors.items():
        value = value.detach().contiguous().cpu()
        tensors[name] = value.clone() if value.data_ptr() in seen else value
        seen.add(value.data_ptr())
    return save(tensors, metadata=metadata)


def decode(data: bytes) -> Payload:
    """The payload in ``data``, or ``WeightPayloadError`` saying what is wrong with it."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        tensors = load(data)
        header_size = int.from_bytes(data[:8], "little")
        metadata = json_rules.loads(data[8 : 8 + header_size], "the safetensors header").get("__metadata__") or {}
    except (SafetensorError, ValueError, UnicodeDecodeError, OverflowError, AttributeError) as exc:
        raise WeightPayloadError(
            f"the body is not a safetensors file ({' '.join(str(exc).split())[:200]})."
        ) from None
    kind = metadata.get("kind")
    if kind not in KINDS:
        raise WeightPayloadError(f"the payload's metadata must say kind 'full' or 'lora', not {str(kind)[:40]!r}.")
    version, run = checked_version(metadata.get("version", "")), checked_run(metadata.get("run"))
    try:
        raw_scaling = json_rules.loads(str(metadata.get("scaling") or "{}"), "the payload's scaling")
    except json_rules.JsonRuleError as exc:
        raise WeightPayloadError(f"{exc} It must be a JSON object of numbers.") from None
    return Payload(kind, version, tensors, checked_scaling(raw_scaling), run)


class LoraMerger:
    """Turns payloads into the whole tensors to copy into one model (``state``: its state_dict)."""

    def __init__(self, state: dict[str, torch.Tensor], tied: set[str], *, on_device: bool = False) -> None:
        """``on_device``: keep each adapted layer's base where the model's weight is, in its dtype, and merge
        there (an engine on a GPU); else an fp32 copy on the host (a server, whose pushes arrive there)."""
        self.state, self.tied, self.on_device = state, tied, on_device
        self.base: dict[str, torch.Tensor] = {}  # weight name -> its last full value, for adapted layers

    def tensors(self, payload: Payload) -> dict[str, torch.Tensor]:
        """Checked names and shapes; for ``lora`` the merged weights. Raises ``WeightPayloadError``. Changes
        nothing: ``commit`` once the model took them."""
        if payload.kind == "full":
            _check_shapes(self.state, payload.tensors)
            return payload.tensors
        return {f"{module}.weight": self._merged(module, payload) for module in _modules(payload)}

    def commit(self, payload: Payload) -> None:
        """The model took ``payload``: a full tensor of an adapted layer is that layer's base from now on."""
        if payload.kind == "full":
            for name, value in payload.tensors.items():
                if name in self.base:
                    self.base[name] = self._kept(name, value)

    def _merged(self, module: str, payload: Payload) -> torch.Tensor:
        name = f"{module}.weight"
        if name not in self.state:
            raise WeightPayloadError(
                f"the adapter names layer '{module[:120]}', which this model does not have."
            )
        if name in self.tied:
            raise WeightPayloadError(
                f"the adapter changes '{name}', which this model shares with another tensor (tied embeddings); "
                "train without an adapter on that layer, or send full weights."
            )
        if module not in payload.scaling:
            raise WeightPayloadError(f"the adapter gives no scaling for layer '{module[:120]}'.")
        base = self.base.get(name)
        if base is None:
            base = self.base[name] = self._kept(name, self.state[name])
        a = payload.tensors[f"{module}.lora_A"].to(base.device, torch.float32)
        b = payload.tensors[f"{module}.lora_B"].to(base.device, torch.float32)
        if (
            a.dim() != 2
            or b.dim() != 2
            or (b.shape[0], a.shape[1]) != tuple(base.shape)
            or a.shape[0] != b.shape[1]
        ):
            raise WeightPayloadError(
                f"the adapter's factors for '{module[:120]}' ({tuple(b.shape)} @ {tuple(a.shape)}) do not make "
                f"its weight's shape {tuple(base.shape)}."
            )
        return base.float() + payload.scaling[module] * (b @ a)  # a new tensor: the base stays as it was

    def _kept(self, name: str, value: torch.Tensor) -> torch.Tensor:
        if self.on_device:
            own = self.state[name]
            return value.detach().to(own.device, own.dtype, copy=True)
        return value.detach().to("cpu", torch.float32, copy=True)


def _modules(payload: Payload) -> list[str]:
    """The adapted layers, each holding exactly its two factors, or ``WeightPayloadError``."""
    factors: dict[str, set[str]] = {}
    for name in payload.tensors:
        factors.setdefault(name.rsplit(".", 1)[0], set()).add(name)
    for module, names in factors.items():
        if names != {f"{module}.lora_A", f"{module}.lora_B"}:
            raise WeightPayloadError(
                f"a lora payload holds '<layer>.lora_A' and '<layer>.lora_B' for each layer; '{module[:120]}' has "
                f"{sorted(names)[:3]}."
            )
    return sorted(factors)


def _check_shapes(state: dict[str, torch.Tensor], tensors: dict[str, torch.Tensor]) -> None:
    for name, value in tensors.items():
        if name not in state:
            raise WeightPayloadError(f"the payload names '{name[:160]}', which this model does not have.")
        if tuple(value.shape) != tuple(state[name].shape):
            raise WeightPayloadError(
                f"the payload's '{name[:160]}' has shape {tuple(value.shape)}, the model's {tuple(state[name].shape)}."
            )


_PEFT_PREFIX = "base_model.model."


def base_name(name: str) -> str:
    """A peft-wrapped tensor's name in the plain model (``base_model.model.X.base_layer.weight`` ->
    ``X.weight``); a plain model's names are unchanged."""
    if name.startswith(_PEFT_PREFIX):
        name = name[len(_PEFT_PREFIX) :]
    return name.replace(".base_layer.", ".")


def lora_scalings(policy: torch.nn.Module) -> dict[str, float]:
    """Each adapted layer's scaling (``lora_alpha / r``, or rsLoRA's), by its base name; empty without LoRA."""
    if not any(".lora_" in name for name, _ in policy.named_parameters()):
        return {}
    lora_layer = require_extra("peft.tuners.lora", "trl", "LoRA weights for inference servers").LoraLayer
    return {base_name(name): float(module.scaling["default"]) for name, module in policy.named_modules()
            if isinstance(module, lora_layer) and "default" in module.scaling}


def lora_payload(state: dict[str, torch.Tensor], scalings: dict[str, float], version: int, run: str = "") -> Payload:
    """The adapter's factors as ``<layer>.lora_A``/``<layer>.lora_B`` with each layer's scaling."""
    tensors = {}
    for name, value in state.items():
        for factor in ("lora_A", "lora_B"):
            marker = f".{factor}.default.weight"
            if name.endswith(marker):
                tensors[f"{base_name(name[: -len(marker)])}.{factor}"] = value
    layers = {k.rsplit(".", 1)[0] for k in tensors}
    return Payload("lora", version, tensors, {layer: scalings[layer] for layer in layers}, run)


def tied_names(model: torch.nn.Module) -> set[str]:
    """Names of parameters that share storage with another name (tied input and output embeddings)."""
    seen: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        seen.setdefault(param.data_ptr(), []).append(name)
    return {name for names in seen.values() if len(names) > 1 for name in names}


def layout_fingerprint(names_shapes: dict[str, tuple[int, ...]]) -> str:
    """What a model's tensors are called and shaped, as a short hash: two processes with the same
    fingerprint can exchange weights by name (dtype is left out: a bf16 server takes fp32 tensors)."""
    text = json.dumps(sorted((k, list(v)) for k, v in names_shapes.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def model_layout(model_path: str) -> str:
    """``layout_fingerprint`` of the model a checkpoint folder or hub id describes, from its config alone
    (built on the meta device: no weights are read or allocated)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return layout_fingerprint({k: tuple(v.shape) for k, v in model.state_dict().items()})


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """The vocabulary and special tokens as a short hash: ids mean the same on both sides only if equal."""
    vocab = sorted(tokenizer.get_vocab().items())
    text = json.dumps([vocab, sorted(map(str, tokenizer.all_special_tokens))])
    return hashlib.sha256(text.encode()).hexdigest()[:16]
