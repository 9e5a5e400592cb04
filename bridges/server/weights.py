"""New weights pushed into a running ``bridges.serve`` by a trainer, numbered by the trainer.

    POST /v1/weights   body: a payload (``bridges.models.weight_payload``: safetensors, kind full or
                       lora, the version it becomes) under 'Authorization: Bearer <weights_key>'
                       -> 200 {"weight_version": v, "tensors": n}
    GET  /health       -> {"status", "model", "weight_version", "layout", "tokenizer"}: what a trainer
                          checks before it uses the server (same tensor names and shapes, same vocabulary)

Why a key of its own: the API key lets a client sample; the weights key lets it change what everyone
samples. A server started without ``weights_key`` takes no pushes (403).

Requests in flight during an update (the hf engine): the update waits for the batch that is running,
which finishes under the old weights and reports the old ``weight_version``; requests queued behind it
are sampled under the new weights and report the new one. No response mixes two versions. Every
chat and completion response carries the ``weight_version`` it was sampled under.

Pushes are applied one at a time, and a push older than the weights the server holds is refused
(409), so a slow trainer request cannot roll a server back.
"""

from __future__ import annotations

import asyncio
from typing import Any

from bridges.models.weight_payload import LoraMerger, WeightPayloadError, decode, tied_names
from bridges.runtime.http_server import bearer_matches

DEFAULT_MAX_WEIGHTS_BYTES = 64 * 1024**3


class WeightEndpoints:
    """The weights route of one server. ``model``: the engine's torch module where the engine runs in
    this process (hf), whose tensors LoRA factors are merged into; None for an engine that keeps its
    weights elsewhere (vLLM), which takes full tensors only."""

    def __init__(self, engine: Any, key: str | None, model: Any, read_body: Any, max_bytes: int) -> None:
        self.engine, self.read_body, self.max_bytes = engine, read_body, max_bytes
        self.expected = f"Bearer {key}".encode() if key else None
        self.merger = LoraMerger(model.state_dict(), tied_names(model)) if model is not None else None
        self.lock = asyncio.Lock()

    def routes(self) -> list[Any]:
        from starlette.routing import Route

        return [Route("/v1/weights", self.push, methods=["POST"])]

    async def push(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        from bridges.agents.sessions import SessionRefusal

        refused = self._refusal(request)
        if refused is not None:
            return refused
        try:
            payload = await asyncio.to_thread(decode, await self.read_body(request, self.max_bytes, "max_weights_bytes"))
        except SessionRefusal as too_large:
            return _error(too_large.status, too_large.message, too_large.code)
        except WeightPayloadError as exc:
            return _error(400, str(exc), "invalid_weights")
        async with self.lock:
            current = int(self.engine.weight_version)
            if payload.version < current:
                return _error(409, f"this server holds weight version {current}; a push of version "
                                   f"{payload.version} would roll it back.", "stale_weights")  # fmt: skip
            try:
                tensors = await asyncio.to_thread(self._tensors, payload)  # a merge is a matmul per layer
                await self.engine.aupdate_weights(tensors, version=payload.version)
            except (WeightPayloadError, ValueError) as exc:  # the engine's own name/shape check is a ValueError
                return _error(400, " ".join(str(exc).split()), "invalid_weights")
        return JSONResponse({"weight_version": payload.version, "tensors": len(tensors)})

    def _refusal(self, request: Any) -> Any:
        if self.expected is None:
            return _error(403, "this server takes no weight updates; start it with weights_key=<secret>.",
                          "weights_disabled")  # fmt: skip
        if not bearer_matches(request, self.expected):
            return _error(401, "missing or wrong weights key: send 'Authorization: Bearer <weights_key>'.",
                          "invalid_weights_key")  # fmt: skip
        return None

    def _tensors(self, payload: Any) -> dict[str, Any]:
        if self.merger is not None:
            return self.merger.tensors(payload)
        if payload.kind == "lora":
            raise WeightPayloadError("this server's engine takes full weights only; send the merged tensors.")
        return dict(payload.tensors)


def _error(status: int, message: str, code: str) -> Any:
    """The refusal in OpenAI's error shape, as every other route of the server sends it."""
    from starlette.responses import JSONResponse

    from bridges.agents.sessions import SessionRefusal

    return JSONResponse(SessionRefusal(status, message, code).body(), status_code=status)
