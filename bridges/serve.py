"""Serve an engine over OpenAI-compatible HTTP, for agents that run out of process.

``python -m bridges.serve model=tiny engine=hf host=127.0.0.1 port=8000 api_key=null``

Every request goes through one ``EngineClient``, so the token ledger works over HTTP exactly as
in-process: a stock ``openai.AsyncOpenAI`` pointed at ``http://host:port/v1`` gets the same JSON,
extras included (``prompt_token_ids``, ``choices[i].token_ids``, ...), and
``extra_body={"return_drift": true}`` adds ``drift_tokens``/``drifted_turns`` to a chat response.

Safety: the server binds loopback by default and refuses a non-loopback host without an
``api_key``: an engine on an open port is free compute for anyone who finds it.
"""

from __future__ import annotations

import hmac
import json
import sys
import time
from dataclasses import dataclass
from typing import Any

from bridges.client.families import FAMILY_NAMES
from bridges.client.http_bodies import response_json, split_kwargs
from bridges.client.tool_calls import TOOL_PARSERS
from bridges.config import option, parse_config, run_cli
from bridges.engines import ENGINES, load_engine
from bridges.errors import ConfigError
from bridges.hardware import DEVICE_HELP, check_device, resolve_device
from bridges.http_server import ServerThread, check_bind


@dataclass
class ServeConfig:
    """Options of ``python -m bridges.serve`` (``key=value`` on the command line)."""

    model: str = option("tiny", help="'tiny', a local folder or a hub id")
    engine: str = option("hf", choices=tuple(ENGINES), help="the engine behind the server")
    host: str = option("127.0.0.1", help="bind address; a non-loopback one requires api_key")
    port: int = option(8000, ge=0, le=65535, help="port (0: a free one)")
    api_key: str | None = option(None, help="required as 'Authorization: Bearer <key>' when set")
    served_model_name: str | None = option(
        None, help="the model name(s) clients send, comma-separated; default: model"
    )
    request_timeout: float = option(600.0, gt=0.0, help="seconds an engine call may take")
    tool_parser: str = option(
        "auto",
        choices=("auto", *TOOL_PARSERS),
        help="tool-call format of the model (auto: from its chat template)",
    )
    family: str = option(
        "auto", choices=("auto", *FAMILY_NAMES), help="model family (auto: detected from its chat template)"
    )
    device: str = option("auto", help=f"the hf engine's device: {DEVICE_HELP}")
    max_batch_size: int = option(64, ge=1, help="hf engine: sequences decoded together")
    max_body_bytes: int = option(8 * 1024 * 1024, ge=1024, help="larger request bodies are refused with 413")
    max_n: int = option(16, ge=1, help="the largest n a request may ask for")
    access_log: bool = option(True, help="one line per request on stderr: method, path, status, latency")
    log_level: str = option("warning", help="uvicorn's log level")


@dataclass(frozen=True)
class ServeLimits:
    """What the HTTP layer enforces on top of the client's own argument checks."""

    model_names: tuple[str, ...] = ()  # empty: the client's model_name
    max_body_bytes: int = 8 * 1024 * 1024
    max_n: int = 16
    access_log: bool = False


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
                f"{scope['method']} {scope['path']} {status[0]} {elapsed:.1f}ms", file=sys.stderr, flush=True
            )

    return logged


class _Endpoints:
    """The server's request handlers over one client; every client error is a 4xx in OpenAI's shape."""

    def __init__(self, client: Any, api_key: str | None, limits: ServeLimits) -> None:
        from bridges.serve_schema import openapi_document

        self.client, self.limits = client, limits
        self.names = list(limits.model_names or (client.model_name,))
        self.expected = f"Bearer {api_key}".encode() if api_key else None
        self.document = openapi_document(self.names, limits.max_n)

    def unauthorized(self, request: Any) -> Any:
        """None when the request may pass, else the 401."""
        given = request.headers.get("authorization", "").encode()
        if self.expected is None or hmac.compare_digest(given, self.expected):
            return None
        return _error_response(
            401, "missing or wrong API key: send 'Authorization: Bearer <api_key>'.", "invalid_api_key"
        )

    async def read_request(self, request: Any, required: tuple[str, ...]) -> Any:
        """The JSON object of a request, or the 4xx response that refuses it."""
        limit = self.limits.max_body_bytes
        try:
            body = json.loads(await _read_body(request, limit))
        except _BodyTooLarge:
            return _error_response(413, f"the request body is larger than {limit} bytes (max_body_bytes).",
                                   "body_too_large")  # fmt: skip
        except RecursionError:
            return _error_response(400, "the request body is nested too deeply.")
        except (ValueError, UnicodeDecodeError):
            return _error_response(400, "the request body is not valid JSON.")
        if not isinstance(body, dict):
            return _error_response(400, "the request body must be a JSON object.")
        for key in required:
            if key not in body or body[key] is None:
                return _error_response(400, f"'{key}' is required.", param=key)
        if not isinstance(body["model"], str) or body["model"] not in self.names:
            return _error_response(
                404, f"the model '{body['model']!s:.80}' does not exist; this server serves {', '.join(self.names)}.",
                "model_not_found", param="model",
            )  # fmt: skip
        n = body.get("n")
        if isinstance(n, int) and not isinstance(n, bool) and n > self.limits.max_n:
            return _error_response(
                400, f"'n' must be at most {self.limits.max_n} on this server (max_n).", param="n"
            )
        return body

    async def create(self, request: Any, create: Any, sdk_create: Any, required: tuple[str, ...]) -> Any:
        from openai import AsyncStream
        from starlette.responses import JSONResponse, StreamingResponse

        from bridges.client.api_errors import error_body

        body = self.unauthorized(request) or await self.read_request(request, required)
        if not isinstance(body, dict):
            return body
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
        return await self.create(request, create, AsyncCompletions.create, ("model", "messages"))

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

        return JSONResponse({"status": "ok", "model": self.client.model_name})

    async def openapi(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        return JSONResponse(self.document)


def _card(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "rl-bridges"}


async def _not_found(request: Any, exc: Exception) -> Any:
    return _error_response(
        404, f"{request.method} {request.url.path:.200} is not served here.", type_="not_found"
    )


def create_app(client: Any, api_key: str | None = None, limits: ServeLimits | None = None) -> Any:
    """A Starlette app serving ``/v1/chat/completions``, ``/v1/completions``, ``/v1/models[/{id}]``,
    ``/health`` and ``/openapi.json``. Every client error is a 4xx in OpenAI's error shape."""
    from starlette.applications import Starlette
    from starlette.routing import Route

    limits = limits or ServeLimits()
    e = _Endpoints(client, api_key, limits)
    routes = [
        Route("/v1/chat/completions", e.chat, methods=["POST"]),
        Route("/v1/completions", e.completions, methods=["POST"]),
        Route("/v1/models", e.models, methods=["GET"]),
        Route("/v1/models/{model:path}", e.model, methods=["GET"]),
        Route("/health", e.health, methods=["GET"]),
        Route("/openapi.json", e.openapi, methods=["GET"]),
    ]
    app = Starlette(routes=routes, exception_handlers={404: _not_found, 405: _not_found})
    return _access_log(app) if limits.access_log else app


def serve_in_thread(
    client: Any,
    host: str = "127.0.0.1",
    port: int = 0,
    api_key: str | None = None,
    log_level: str = "warning",
    limits: ServeLimits | None = None,
) -> ServerThread:
    """Serve ``client`` on ``host:port`` (0 = a free port) in a background thread; returns the handle."""
    check_bind(host, api_key)
    app = create_app(client, api_key=api_key, limits=limits)
    return ServerThread(app, host=host, port=port, log_level=log_level)


def engine_options(config: ServeConfig) -> dict[str, Any]:
    """What the named engine is built with: the hf engine takes a device and a batch size; vLLM places
    itself (``CUDA_VISIBLE_DEVICES``, its own parallelism settings) and takes no device argument."""
    if config.engine == "hf":
        return {"device": resolve_device(config.device), "max_batch_size": config.max_batch_size}
    return {}


def build_engine(config: ServeConfig) -> Any:
    """The engine named by ``config.engine``, from the engine table (a missing extra is one sentence)."""
    return load_engine(config.engine, config.model, **engine_options(config))


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    from bridges.client import EngineClient

    config = parse_config(ServeConfig, sys.argv[1:] if argv is None else argv)
    check_bind(config.host, config.api_key)
    names = tuple(n.strip() for n in (config.served_model_name or config.model).split(",") if n.strip())
    if not names:
        raise ConfigError("served_model_name names no model; give one name or comma-separated names.")
    if config.engine == "hf":
        from bridges.preflight import check_model

        check_model(config.model)
        check_device(config.device)
    engine = build_engine(config)
    client = EngineClient(
        engine,
        model_name=names[0],
        request_timeout=config.request_timeout,
        tool_parser=None if config.tool_parser == "auto" else config.tool_parser,
        family=None if config.family == "auto" else config.family,
    )
    limits = ServeLimits(names, config.max_body_bytes, config.max_n, config.access_log)
    app = create_app(client, api_key=config.api_key, limits=limits)
    print(
        f"serving '{client.model_name}' ({config.engine} engine) at http://{config.host}:{config.port}/v1",
        flush=True,
    )
    uvicorn.run(app, host=config.host, port=config.port, log_level=config.log_level)
    return 0


def cli() -> None:
    """Console-script entry point: errors print as one sentence and exit 2, as with ``python -m``."""
    run_cli(main)


if __name__ == "__main__":
    run_cli(main)
