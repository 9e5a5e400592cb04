"""New weights pushed into a running ``bridges.serve`` by a trainer, numbered by the trainer.

    POST /v1/weights   body: a payload (``bridges.models.weight_payload``: safetensors, kind full or
                       lora, the version it becomes and the run that numbers it) under
                       'Authorization: Bearer <weights_key>' -> 200 {"weight_version": v, "tensors": n}
    POST /v1/weights/channel  body: {"host", "port", "prefix", "backend": gloo|nccl, "timeout_s"}: join
                       the trainer's process group of two (``bridges.models.weight_channel``); then a
                       POST /v1/weights whose JSON body is a manifest takes the tensors over it
    GET  /health       -> {"status", "model", "weight_version", "weight_run", "layout", "tokenizer",
                          "weight_channels"}:
                          what a trainer checks before it uses the server (same tensor names and
                          shapes, same vocabulary) and how it may push

Why a key of its own: the API key lets a client sample; the weights key lets it change what everyone
samples. A server started without ``weights_key`` takes no pushes (403).

Requests in flight during an update (the hf engine): the update waits for the batch that is running,
which finishes under the old weights and reports the old ``weight_version``; requests queued behind it
are sampled under the new weights and report the new one. No response mixes two versions. Every
chat and completion response carries the ``weight_version`` it was sampled under.

Pushes are applied one at a time. Within one trainer run a push older than the weights the server
holds is refused (409), so a slow trainer request cannot roll a server back; a push from another run
(a resumed or new trainer) is taken at any version. Every tensor is checked (finite, floating point
where the model's is) after any LoRA merge and before anything is copied: a refusal changes nothing.
A channel push is checked (version, size) before the server marks it ready, so a refused push is
never broadcast; a channel that breaks mid-push is closed (503) and the trainer joins again.

A channel join makes this server connect out, so it is held to the trainer's own address (the peer
of the join request, or a host listed in ``channel_hosts``), a timeout of at most ``MAX_JOIN_S``,
and threads of its own (``CHANNEL_THREADS``: a peer that accepts and never answers cannot stall
sampling, and hangs only the thread it holds); a push never awaits a join under the push lock; the
caller learns only that the channel failed (the detail goes to the server's log); a replaced pair
is closed.
"""

from __future__ import annotations

import asyncio
import ipaddress
import math
import sys
from typing import Any

import torch

from bridges.models.weight_channel import Manifest, Pair, check_backend
from bridges.models.weight_payload import (
    LoraMerger,
    Payload,
    WeightPayloadError,
    check_values,
    decode,
    tied_names,
)
from bridges.runtime import json_rules
from bridges.runtime.http_server import bearer_matches
from bridges.runtime.usercode import DaemonPool, call_user

DEFAULT_MAX_WEIGHTS_BYTES = 64 * 1024**3
MAX_JOIN_S = 600.0
MAX_JOIN_BYTES = 64 * 1024  # a join is a host, a port, a prefix and a timeout
MAX_HUNG_JOINS = 4  # joins past their timeout whose threads are still stuck: then joins are refused
CHANNEL_THREADS = DaemonPool(2, "bridges-weight-channel")
CHANNEL_FAILED = "the weight channel failed; join it again."


class WeightEndpoints:
    """The weights route of one server. ``model``: the engine's torch module where the engine runs in
    this process (hf), whose tensors LoRA factors are merged into; None for an engine that keeps its
    weights elsewhere (vLLM), which takes full tensors only."""

    def __init__(
        self, engine: Any, key: str | None, model: Any, read_body: Any, max_bytes: int,
        channel_hosts: tuple[str, ...] = (),
    ) -> None:
        self.engine, self.read_body, self.max_bytes = engine, read_body, max_bytes
        self.expected = f"Bearer {key}".encode() if key else None
        self.state: dict[str, torch.Tensor] | None = None  # names, shapes and dtypes to check (hf)
        self.merger: LoraMerger | None = None
        if model is not None:
            self.state = model.state_dict()
            self.merger = LoraMerger(self.state, tied_names(model))
        self.device = next(model.parameters()).device if model is not None else None  # nccl buffers go here
        self.channel_hosts = channel_hosts  # trainer hosts a join may name besides its own address
        self.lock = asyncio.Lock()
        self.joining: asyncio.Future[Pair] | None = None  # the trainer's weight channel, once asked to join
        self.run = ""  # the trainer run the held weights were numbered by ("": those loaded at start)

    def routes(self) -> list[Any]:
        from starlette.routing import Route

        return [Route("/v1/weights", self.push, methods=["POST"]),
                Route("/v1/weights/channel", self.join, methods=["POST"])]

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

        from bridges.agents.sessions import SessionRefusal

        refused = self._refusal(request)
        if refused is not None:
            return refused
        try:
            where, backend, timeout_s = _join_request(
                await self.read_body(request, MAX_JOIN_BYTES, "a channel join's limit")
            )
        except SessionRefusal as too_large:  # 413, as on every other route
            return _error(too_large.status, too_large.message, too_large.code)
        except WeightPayloadError as exc:
            return _error(400, str(exc), "invalid_channel")
        peer = request.client.host if request.client is not None else ""
        if _host(where[0]) not in {_host(peer), *map(_host, self.channel_hosts)}:
            return _error(403, "a weight channel joins only the address its request came from; start the "
                               "server with channel_hosts=<host> to allow another.", "channel_host_refused")
        if CHANNEL_THREADS.threads_abandoned >= MAX_HUNG_JOINS:
            return _error(503, f"{MAX_HUNG_JOINS} weight channel joins hang past their timeout on peers that never "
                               "answer; try again once those peers close, or restart the server.", "channel_busy")
        earlier, self.joining = self.joining, asyncio.ensure_future(self._connect(where, backend, timeout_s))
        if earlier is not None:
            earlier.add_done_callback(_close_pair)
        return JSONResponse({"channel": backend})

    async def _connect(self, where: tuple[str, int, str], backend: str, timeout_s: float) -> Pair:
        return await call_user(Pair.join, *where, backend, timeout_s, self.device, timeout=timeout_s,
                               what="the weight channel's join", pool=CHANNEL_THREADS)

    async def _channel_push(self, raw: bytes) -> Any:
        try:
            manifest = Manifest.from_json(json_rules.loads(raw, "the manifest"))
        except (ValueError, OverflowError, TypeError) as exc:  # JsonRuleError and WeightPayloadError say why
            message = str(exc) if isinstance(exc, (WeightPayloadError, json_rules.JsonRuleError)) else (
                "the manifest is not a weight manifest.")
            return _error(400, message, "invalid_weights")
        if manifest.nbytes() > self.max_bytes:
            return _error(413, f"the pushed tensors are larger than {self.max_bytes} bytes (max_weights_bytes).",
                          "body_too_large")
        joining = self.joining
        if joining is None:
            return _error(400, "no weight channel is open: POST /v1/weights/channel first.", "no_channel")
        try:
            pair = await asyncio.shield(joining)  # bounded by the join's own timeout; no lock held
        except Exception as exc:  # noqa: BLE001 - the group never formed
            return self._broken(joining, None, exc)
        async with self.lock:
            stale = self._stale(manifest.run, manifest.version)
            if stale is not None:
                return stale
            try:
                tensors = await call_user(_take, pair, manifest, timeout=None, what="a channel push",
                                          pool=CHANNEL_THREADS)
            except Exception as exc:  # noqa: BLE001 - the trainer died or the channel broke mid-push
                return self._broken(joining, pair, exc)
            payload = Payload(manifest.kind, manifest.version, tensors, manifest.scaling, manifest.run)
            return await self._apply(payload)

    def _broken(self, joining: asyncio.Future[Pair], pair: Pair | None, exc: BaseException) -> Any:
        """A channel that failed: dropped and closed; the caller is told no more than that (what
        answered at the address it named stays in this server's log)."""
        if self.joining is joining:
            self.joining = None
        if pair is not None:
            pair.close()
        print(f"weight channel failed: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}",
              file=sys.stderr, flush=True)
        return _error(503, CHANNEL_FAILED, "channel_broken")

    def _stale(self, run: str, version: int) -> Any:
        """409 for a push that would roll this run's weights back; another run's push is taken."""
        current = int(self.engine.weight_version)
        if run != self.run or version >= current:
            return None
        return _error(409, f"this server holds weight version {current} of this run; a push of version "
                           f"{version} would roll it back.", "stale_weights")

    async def _apply(self, payload: Payload) -> Any:
        """Under ``lock``: the payload into the engine, or the refusal that leaves it as it was."""
        from starlette.responses import JSONResponse

        stale = self._stale(payload.run, payload.version)
        if stale is not None:
            return stale
        try:
            tensors = await asyncio.to_thread(self._tensors, payload)  # a merge is a matmul per layer
            # an engine in this process probes the new weights (one forward) and rolls back what makes
            # its logits non-finite: finite weights can still overflow (a norm weight of 3e38)
            verify = {"verify": True} if self.state is not None else {}
            await self.engine.aupdate_weights(tensors, version=payload.version, **verify)
        except (WeightPayloadError, ValueError) as exc:  # the engine's own name/shape check is a ValueError
            return _error(400, " ".join(str(exc).split()), "invalid_weights")
        if self.merger is not None:
            self.merger.commit(payload)
        self.run = payload.run
        return JSONResponse({"weight_version": payload.version, "tensors": len(tensors)})

    def _refusal(self, request: Any) -> Any:
        if self.expected is None:
            return _error(403, "this server takes no weight updates; start it with weights_key=<secret>.",
                          "weights_disabled")
        if not bearer_matches(request, self.expected):
            return _error(401, "missing or wrong weights key: send 'Authorization: Bearer <weights_key>'.",
                          "invalid_weights_key")
        return None

    def _tensors(self, payload: Any) -> dict[str, Any]:
        """What to copy into the engine, every value checked before the merger or the engine keeps any."""
        if self.merger is None and payload.kind == "lora":
            raise WeightPayloadError("this server's engine takes full weights only; send the merged tensors.")
        check_values(payload.tensors, self.state if payload.kind == "full" else None)
        if self.merger is None:
            return dict(payload.tensors)
        tensors = self.merger.tensors(payload)
        if payload.kind == "lora":
            check_values(tensors, self.state)  # a finite adapter with a huge scaling overflows here
        return tensors


def _join_request(raw: bytes) -> tuple[tuple[str, int, str], str, float]:
    """(host, port, prefix), backend and timeout of a join body, or ``WeightPayloadError``."""
    try:
        body = json_rules.loads(raw, "a channel join's body")
        where = (str(body["host"]), int(body["port"]), str(body["prefix"]))
        backend, timeout_s = str(body["backend"]), float(body.get("timeout_s", 60.0))
    except Exception:  # noqa: BLE001 - any malformed body gets the one sentence
        raise WeightPayloadError("a channel join's body must be {host, port, prefix, backend, timeout_s}.") from None
    check_backend(backend)
    if not (math.isfinite(timeout_s) and 0 < timeout_s <= MAX_JOIN_S):
        raise WeightPayloadError(f"a channel join's timeout_s must be above 0 and at most {MAX_JOIN_S:.0f} seconds.")
    if not 0 < where[1] < 65536 or not 0 < len(where[2]) <= 200:
        raise WeightPayloadError("a channel join needs a port from 1 to 65535 and a prefix of 1-200 characters.")
    return where, backend, timeout_s


def _host(address: str) -> str:
    """An address in one spelling (an IPv4 peer seen through an IPv6 socket is ``::ffff:a.b.c.d``)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address.lower()
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return str(mapped or ip)


def _take(pair: Pair, manifest: Manifest) -> dict[str, torch.Tensor]:
    """Tell the trainer to send (the ready mark), then receive: both wait on the trainer, so both run
    on a channel thread, never on the event loop or the executor sampling shares."""
    pair.mark_ready(manifest.push)
    return pair.receive(manifest)


def _close_pair(joining: asyncio.Future[Pair]) -> None:
    """A replaced join's pair, once it formed, is closed (a failed or cancelled one holds nothing)."""
    if not joining.cancelled() and joining.exception() is None:
        joining.result().close()


def _error(status: int, message: str, code: str) -> Any:
    """The refusal in OpenAI's error shape, as every other route of the server sends it."""
    from starlette.responses import JSONResponse

    from bridges.agents.sessions import SessionRefusal

    return JSONResponse(SessionRefusal(status, message, code).body(), status_code=status)
