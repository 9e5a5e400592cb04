"""The OpenAI-compatible HTTP app over one EngineClient: endpoints, limits, errors in OpenAI's shape.

Every request goes through the one client, so the token ledger works over HTTP exactly as in-process;
every client mistake is a 4xx in OpenAI's error shape, never a 500. ``python -m bridges.serve`` builds
the engine and the client and hands them here.
"""

from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass
from typing import Any

from bridges.client.arguments import integral
from bridges.client.http_bodies import response_json, split_kwargs, tool_calls_problem
from bridges.runtime import json_rules
from bridges.runtime.http_server import ServerThread, bearer_matches, check_bind
from bridges.server.sessions import SessionEndpoints
from bridges.server.weights import DEFAULT_MAX_WEIGHTS_BYTES, WeightEndpoints


@dataclass(frozen=True)
class ServeLimits:
    """What the HTTP layer enforces on top of the client's own argument checks."""

    model_names: tuple[str, ...] = ()  # empty: the client's model_name
    max_body_bytes: int = 8 * 1024 * 1024
    max_n: int = 16
    access_log: bool = False
    public_url: str | None = None  # what sessions' base_url starts with; None: the bound address


def _error_response(
    status: int,
    message: str,
    code: str | None = None,
    type_: str = "invalid_request_error",
    param: str | None = None,
) -> Any:
    from starlette.responses import JSONResponse

    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return JSONResponse(body, status_code=status)


class _BodyTooLarge(Exception):
    pass


async def _read_body(request: Any, limit: int) -> bytes:
    """The body, refused past ``limit`` bytes whatever Content-Length claims (it may lie or be absent)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _BodyTooLarge
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _BodyTooLarge
        chunks.append(chunk)
    return b"".join(chunks)


async def _read_limited(request: Any, limit: int, option: str) -> bytes:
    """``_read_body`` with its refusal as ``SessionRefusal`` (413) naming the ``option`` that sets ``limit``."""
    from bridges.agents.sessions import SessionRefusal

    try:
        return await _read_body(request, limit)
    except _BodyTooLarge:
        raise SessionRefusal(413, f"the request body is larger than {limit} bytes ({option}).",
                             "body_too_large") from None


# a segment after "s" or "sessions" anywhere in the path (//s/ID, /v1/../s/ID, /./s/ID reach the same
# routes or a 404), and any segment shaped like an id (24+ URL-safe characters), wherever it appears
_SESSION_IN_PATH = re.compile(r"(?<=/)(?:(s|sessions)/[^/]+|[A-Za-z0-9_-]{24,})(?=/|$)")


def logged_path(path: str) -> str:
    """``path`` as the access log prints it: a session id is its capability (whoever reads the log could
    call the session), so it is left out wherever it appears."""
    return _SESSION_IN_PATH.sub(lambda m: f"{m.group(1)}/<session>" if m.group(1) else "<session>", path)


def _access_log(app: Any) -> Any:
    """ASGI middleware: one stderr line per request (method, path, status, milliseconds)."""

    async def logged(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        started, status = time.perf_counter(), [0]

        async def capture(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await app(scope, receive, capture)
        finally:
            elapsed = (time.perf_counter() - started) * 1000
            print(
                f"{scope['method']} {logged_path(scope['path'])} {status[0]} {elapsed:.1f}ms", file=sys.stderr, flush=True
            )

    return logged


class _Endpoints:
    """The server's request handlers over one client; every client error is a 4xx in OpenAI's shape."""

    def __init__(
        self, client: Any, api_key: str | None, limits: ServeLimits, identity: dict[str, str],
        weights: WeightEndpoints,
    ) -> None:
        from bridges.server.schema import openapi_document

        self.client, self.limits, self.identity, self.weights = client, limits, identity, weights
        self.names = list(limits.model_names or (client.model_name,))
        self.expected = f"Bearer {api_key}".encode() if api_key else None
        self.document = openapi_document(self.names, limits.max_n, len(client.engine.tokenizer),
                                         tuple(weights.channels()))

    def unauthorized(self, request: Any) -> Any:
        """None when the request may pass, else the 401."""
        if self.expected is None or bearer_matches(request, self.expected):
            return None
        return _error_response(
            401, "missing or wrong API key: send 'Authorization: Bearer <api_key>'.", "invalid_api_key"
        )

    async def read_raw(self, request: Any) -> bytes:
        """The body's bytes, or ``SessionRefusal`` (413) past ``max_body_bytes``."""
        return await _read_limited(request, self.limits.max_body_bytes, "max_body_bytes")

    async def read_request(self, request: Any, required: tuple[str, ...]) -> Any:
        """The JSON object of a request, or the 4xx response that refuses it."""
        from bridges.agents.sessions import SessionRefusal

        try:
            body = json_rules.loads(await self.read_raw(request))
        except SessionRefusal as refusal:  # past max_body_bytes
            return _error_response(refusal.status, refusal.message, refusal.code)
        except json_rules.JsonRuleError as exc:  # not JSON, nested too deeply, or not Unicode
            return _error_response(400, str(exc), param=exc.where)
        if not isinstance(body, dict):
            return _error_response(400, "the request body must be a JSON object.")
        for key in required:
            if key not in body or body[key] is None:
                return _error_response(400, f"'{key}' is required.", param=key)
        if not isinstance(body["model"], str) or body["model"] not in self.names:
            return _error_response(
                404, f"the model '{body['model']!s:.80}' does not exist; this server serves {', '.join(self.names)}.",
                "model_not_found", param="model",
            )
        n = integral(body.get("n"))  # by value: 40.0 is 40 (JSON has one number type)
        if n is not None and n > self.limits.max_n:
            return _error_response(
                400, f"'n' must be at most {self.limits.max_n} on this server (max_n).", param="n"
            )
        return body

    async def create(
        self, request: Any, create: Any, sdk_create: Any, required: tuple[str, ...], check: Any = None
    ) -> Any:
        from openai import AsyncStream
        from starlette.responses import JSONResponse, StreamingResponse

        from bridges.client.api_errors import error_body

        body = self.unauthorized(request) or await self.read_request(request, required)
        if not isinstance(body, dict):
            return body
        refusal = check(body) if check is not None else None
        if refusal is not None:
            return refusal
        try:
            response = await create(**split_kwargs(body, sdk_create))
        except TypeError as exc:  # an argument the SDK's create does not take, as the SDK would report it
            return _error_response(400, " ".join(str(exc).split()))
        except RecursionError:
            return _error_response(400, "the request is nested too deeply.")
        except Exception as exc:
            status, payload = error_body(exc)
            return JSONResponse(payload, status_code=status)
        if isinstance(response, AsyncStream):  # stream=True: the events EngineClient built, as they are
            return StreamingResponse(response.response.aiter_bytes(), media_type="text/event-stream")
        return JSONResponse(response_json(response))

    async def chat(self, request: Any) -> Any:
        from openai.resources.chat.completions import AsyncCompletions

        create = self.client.chat.completions.create
        return await self.create(
            request, create, AsyncCompletions.create, ("model", "messages"), _wire_tool_calls
        )

    async def completions(self, request: Any) -> Any:
        from openai.resources.completions import AsyncCompletions

        return await self.create(
            request, self.client.completions.create, AsyncCompletions.create, ("model", "prompt")
        )

    async def models(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        return self.unauthorized(request) or JSONResponse(
            {"object": "list", "data": [_card(n) for n in self.names]}
        )

    async def model(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        denied = self.unauthorized(request)
        if denied is not None:
            return denied
        name = request.path_params["model"]
        if name not in self.names:
            return _error_response(
                404, f"the model '{name:.80}' does not exist.", "model_not_found", param="model"
            )
        return JSONResponse(_card(name))

    async def health(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        return JSONResponse({"status": "ok", "model": self.client.model_name,
                             "weight_version": int(self.client.engine.weight_version),
                             "weight_run": self.weights.run, **self.identity,
                             "weight_channels": WeightEndpoints.channels()})

    async def openapi(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        return JSONResponse(self.document)


def _wire_tool_calls(body: dict[str, Any]) -> Any:
    """The 400 for tool calls off OpenAI's wire format (``tool_calls_problem``); None when they are on it."""
    problem = tool_calls_problem(body)
    return None if problem is None else _error_response(400, problem[1], param=problem[0])


def _card(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "rl-bridges"}


async def _not_found(request: Any, exc: Exception) -> Any:
    return _error_response(
        404, f"{request.method} {request.url.path:.200} is not served here.", type_="not_found"
    )


async def _not_allowed(request: Any, exc: Any) -> Any:
    """A served path asked with another method: 405 with ``Allow`` naming the ones it takes (RFC 9110)."""
    allow = ", ".join(sorted(exc.headers["Allow"].split(", ")))  # starlette's, from a set: sorted
    response = _error_response(
        405,
        f"{request.method} is not allowed on {request.url.path:.200}; use {allow}.",
        type_="method_not_allowed",
    )
    response.headers["Allow"] = allow
    return response


@dataclass(frozen=True)
class WeightUpdates:
    """How a server takes pushed weights (``bridges.server.weights``): its key, and the engine's torch
    module where LoRA factors are merged (None for an engine that keeps its weights elsewhere)."""

    key: str | None = None
    model: Any = None
    max_bytes: int = DEFAULT_MAX_WEIGHTS_BYTES
    channel_hosts: tuple[str, ...] = ()  # trainer hosts a channel join may name besides its own address


def create_app(
    client: Any, api_key: str | None = None, limits: ServeLimits | None = None,
    updates: WeightUpdates | None = None, identity: dict[str, str] | None = None,
) -> Any:
    """A Starlette app serving ``/v1/chat/completions``, ``/v1/completions``, ``/v1/models[/{id}]``,
    ``/health`` (with ``identity``: the model's tensor layout and vocabulary fingerprints), ``/openapi.json``,
    per-rollout sessions (``bridges.server.sessions``) and weight pushes (``bridges.server.weights``).
    Every client error is a 4xx in OpenAI's error shape."""
    from starlette.applications import Starlette
    from starlette.routing import Route

    limits, updates = limits or ServeLimits(), updates or WeightUpdates()
    weights = WeightEndpoints(client.engine, updates.key, updates.model, _read_limited, updates.max_bytes,
                              updates.channel_hosts)
    e = _Endpoints(client, api_key, limits, identity or {}, weights)
    sessions = SessionEndpoints(client, e.names[0], e.unauthorized, e.read_raw, limits.public_url)
    routes = [
        *sessions.routes(),
        *weights.routes(),
        Route("/v1/chat/completions", e.chat, methods=["POST"]),
        Route("/v1/completions", e.completions, methods=["POST"]),
        Route("/v1/models", e.models, methods=["GET"]),
        Route("/v1/models/{model:path}", e.model, methods=["GET"]),
        Route("/health", e.health, methods=["GET"]),
        Route("/openapi.json", e.openapi, methods=["GET"]),
    ]
    app = Starlette(routes=routes, exception_handlers={404: _not_found, 405: _not_allowed})
    app.router.redirect_slashes = False  # its 307 would point at whatever the Host header said: a 404 instead
    return _access_log(app) if limits.access_log else app


def serve_in_thread(
    client: Any,
    host: str = "127.0.0.1",
    port: int = 0,
    api_key: str | None = None,
    log_level: str = "warning",
    limits: ServeLimits | None = None,
    updates: WeightUpdates | None = None,
    identity: dict[str, str] | None = None,
) -> ServerThread:
    """Serve ``client`` on ``host:port`` (0 = a free port) in a background thread; returns the handle."""
    check_bind(host, api_key)
    app = create_app(client, api_key=api_key, limits=limits, updates=updates, identity=identity)
    return ServerThread(app, host=host, port=port, log_level=log_level)
