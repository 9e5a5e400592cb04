"""New weights pushed into a running ``bridges.serve`` by a trainer, numbered by the trainer.

    POST /v1/weights   body: a payload (``bridges.models.weight_payload``: safetensors, kind full or
                       lora, the version it becomes) under 'Authorization: Bearer <weights_key>'
                       -> 200 {"weight_version": v, "tensors": n}
    POST /v1/weights/channel  body: {"host", "port", "prefix", "backend": gloo|nccl, "timeout_s"}: join
                       the trainer's process group of two (``bridges.models.weight_channel``); then a
                       POST /v1/weights whose JSON body is a manifest takes the tensors over it
    GET  /health       -> {"status", "model", "weight_version", "layout", "tokenizer", "weight_channels"}:
                          what a trainer checks before it uses the server (same tensor names and
                          shapes, same vocabulary) and how it may push

Why a key of its own: the API key lets a client sample; the weights key lets it change what everyone
samples. A server started without ``weights_key`` takes no pushes (403).

Requests in flight during an update (the hf engine): the update waits for the batch that is running,
which finishes under the old weights and reports the old ``weight_version``; requests queued behind it
are sampled under the new weights and report the new one. No response mixes two versions. Every
chat and completion response carries the ``weight_version`` it was sampled under.

Pushes are applied one at a time, and a push older than the weights the server holds is refused
(409), so a slow trainer request cannot roll a server back. A channel push is checked (version,
size) before the server marks it ready, so a refused push is never broadcast; a channel that breaks
mid-push is closed (503) and the trainer joins again.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import torch

from bridges.models.weight_channel import Manifest, Pair, check_backend
from bridges.models.weight_payload import LoraMerger, Payload, WeightPayloadError, decode, tied_names
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
        self.device = next(model.parameters()).device if model is not None else None  # nccl buffers go here
        self.lock = asyncio.Lock()
        self.joining: asyncio.Future[Pair] | None = None  # the trainer's weight channel, once asked to join

    def routes(self) -> list[Any]:
        from starlette.routing import Route

        return [Route("/v1/weights", self.push, methods=["POST"]),
                Route("/v1/weights/channel", self.join, methods=["POST"])]  # fmt: skip

    @staticmethod
    def channels() -> list[str]:
        """How this server can take weights, for ``/health``."""
        nccl = torch.distributed.is_nccl_available() and torch.cuda.is_available()
        return ["http", "gloo", *(["nccl"] if nccl else [])]

    async def push(self, request: Any) -> Any:
        from bridges.agents.sessions import SessionRefusal

        refused = self._refusal(request)
        if refused is not None:
            return refused
        try:
            raw = await self.read_body(request, self.max_bytes, "max_weights_bytes")
        except SessionRefusal as too_large:
            return _error(too_large.status, too_large.message, too_large.code)
        if request.headers.get("content-type", "").startswith("application/json"):
            return await self._channel_push(raw)
        try:
            payload = await asyncio.to_thread(decode, raw)
        except WeightPayloadError as exc:
            return _error(400, str(exc), "invalid_weights")
        async with self.lock:
            return await self._apply(payload)

    async def join(self, request: Any) -> Any:
        """Join the trainer's process group of two, replacing any earlier channel. The join is checked
        and answered at once; the group completes in the background as the trainer opens its side."""
        from starlette.responses import JSONResponse

        refused = self._refusal(request)
        if refused is not None:
            return refused
        try:
            body = json.loads(await self.read_body(request, 64 * 1024, "a channel join's limit"))
            where = (str(body["host"]), int(body["port"]), str(body["prefix"]))
            backend, timeout_s = str(body["backend"]), float(body.get("timeout_s", 600.0))
            check_backend(backend)
        except WeightPayloadError as exc:
            return _error(400, str(exc), "invalid_channel")
        except Exception:  # noqa: BLE001 - any malformed body gets the one sentence
            return _error(400, "a channel join's body must be {host, port, prefix, backend, timeout_s}.",
                          "invalid_channel")  # fmt: skip
        async with self.lock:
            self.joining = asyncio.ensure_future(asyncio.to_thread(Pair.join, *where, backend, timeout_s, self.device))
        return JSONResponse({"channel": backend})

    async def _channel_push(self, raw: bytes) -> Any:
        try:
            manifest = Manifest.from_json(json.loads(raw))
        except (ValueError, WeightPayloadError) as exc:
            return _error(400, str(exc) if isinstance(exc, WeightPayloadError) else "the manifest is not JSON.",
                          "invalid_weights")  # fmt: skip
        if manifest.nbytes() > self.max_bytes:
            return _error(413, f"the pushed tensors are larger than {self.max_bytes} bytes (max_weights_bytes).",
                          "body_too_large")  # fmt: skip
        async with self.lock:
            if self.joining is None:
                return _error(400, "no weight channel is open: POST /v1/weights/channel first.", "no_channel")
            stale = self._stale(manifest.version)
            if stale is not None:
                return stale
            try:
                pair = await self.joining
                pair.mark_ready(manifest.push)
                tensors = await asyncio.to_thread(pair.receive, manifest)
            except Exception as exc:  # noqa: BLE001 - the group never formed, the trainer died or it broke
                self.joining = None
                return _error(503, f"the weight channel failed ({' '.join(str(exc).split())[:200]}); "
                                   "join it again.", "channel_broken")  # fmt: skip
            return await self._apply(Payload(manifest.kind, manifest.version, tensors, manifest.scaling))

    def _stale(self, version: int) -> Any:
        current = int(self.engine.weight_version)
        if version >= current:
            return None
        return _error(409, f"this server holds weight version {current}; a push of version "
                           f"{version} would roll it back.", "stale_weights")  # fmt: skip

    async def _apply(self, payload: Payload) -> Any:
        """Under ``lock``: the payload into the engine, or the refusal that leaves it as it was."""
        from starlette.responses import JSONResponse

        stale = self._stale(payload.version)
        if stale is not None:
            return stale
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
