"""What a client may send the local Tinker server: each check refuses a bad value in one sentence.

The server runs client-chosen numbers through a real model and turns client-chosen names into file
names, so nothing a request carries is trusted: names are plain folder names, counts are capped,
sampling parameters are finite and in range, token ids are inside the vocabulary.
"""

from __future__ import annotations

import math
import re
from typing import Any

from fastapi import Request

MAX_NUM_SAMPLES = 128  # per sample request
MAX_LORA_RANK = 512
_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def plain_name(value: Any, what: str) -> str:
    """A client-given name that becomes one folder name: no separators, no '..', no leading dot."""
    if not isinstance(value, str) or not _PLAIN_NAME.fullmatch(value):
        raise ValueError(
            f"{what} '{value!s:.80}' is refused: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit."
        )
    return value


async def json_body(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except RecursionError:
        raise ValueError("the request body is nested too deeply.") from None
    except ValueError:
        raise ValueError("the request body is not valid JSON.") from None
    if not isinstance(body, dict):
        raise ValueError("the request body must be a JSON object.")
    return body


def _finite_number(
    value: Any, name: str, *, minimum: float | None = None, above: float | None = None
) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r:.40}.")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value!r:.40}.")
    if above is not None and value <= above:
        raise ValueError(f"{name} must be greater than {above}, got {value!r:.40}.")
    return float(value)


def check_sample_request(body: dict[str, Any], vocab_size: int) -> dict[str, Any]:
    """Refuse a sample request the model cannot serve, in one sentence, before it is queued."""
    n = body.get("num_samples", 1)
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_NUM_SAMPLES:
        raise ValueError(f"num_samples must be an integer from 1 to {MAX_NUM_SAMPLES}, got {n!r:.40}.")
    params = body.get("sampling_params")
    if not isinstance(params, dict):
        raise ValueError("sampling_params must be an object.")
    # 0 is greedy decoding, which the local sampler implements; below 0 has no meaning
    _finite_number(params.get("temperature", 1.0), "sampling_params.temperature", minimum=0.0)
    top_p = _finite_number(params.get("top_p", 1.0), "sampling_params.top_p", above=0.0)
    if top_p > 1:
        raise ValueError(f"sampling_params.top_p must be at most 1, got {top_p}.")
    max_tokens = params.get("max_tokens")
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
    ):
        raise ValueError(f"sampling_params.max_tokens must be a positive integer, got {max_tokens!r:.40}.")
    prompt = body.get("prompt")
    chunks = prompt.get("chunks") if isinstance(prompt, dict) else None
    if not isinstance(chunks, list) or not all(isinstance(c, dict) for c in chunks):
        raise ValueError("prompt must be an object with a list of chunks.")
    for chunk in chunks:
        tokens = chunk.get("tokens", [])
        if not isinstance(tokens, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab_size for t in tokens
        ):
            raise ValueError(f"every prompt token must be an integer id from 0 to {vocab_size - 1}.")
    return body


def check_adam(adam: Any) -> dict[str, Any]:
    if not isinstance(adam, dict):
        raise ValueError("adam_params must be an object.")
    for key, value in adam.items():
        if key in ("learning_rate", "beta1", "beta2", "eps", "weight_decay", "grad_clip_norm"):
            _finite_number(value, f"adam_params.{key}")
    return adam
