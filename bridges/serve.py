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

import asyncio
import hmac
import ipaddress
import socket
import sys
import threading
from dataclasses import dataclass
from typing import Any

from bridges.client.http_bodies import response_json, split_kwargs
from bridges.config import parse_config, run_cli
from bridges.errors import ConfigError

ENGINES: dict[str, str] = {"hf": "adapters.hf:HFEngine", "vllm": "adapters.vllm:VLLMEngine"}


@dataclass
class ServeConfig:
    """Options of ``python -m bridges.serve`` (``key=value`` on the command line)."""

    model: str = "tiny"  # "tiny", a local folder or a hub id
    engine: str = "hf"  # a key of ENGINES
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None  # required to bind a non-loopback host
    served_model_name: str | None = None  # the name /v1/models reports (default: model)
    request_timeout: float = 600.0
    tool_parser: str = "hermes"  # hermes | llama3_json
    device: str = "cpu"
    max_batch_size: int = 64
    log_level: str = "warning"


def _error_response(
    status: int, message: str, code: str | None = None, type_: str = "invalid_request_error"
) -> Any:
    from starlette.responses import JSONResponse

    body = {"error": {"message": message, "type": type_, "param": None, "code": code}}
    return JSONResponse(body, status_code=status)


def create_app(client: Any, api_key: str | None = None) -> Any:
    """A Starlette app serving ``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``, ``/health``."""
    from openai.resources.chat.completions import AsyncCompletions as SDKChatCompletions
    from openai.resources.completions import AsyncCompletions as SDKCompletions
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    from bridges.client.api_errors import error_body

    expected = f"Bearer {api_key}".encode() if api_key else None

    def unauthorized(request: Request) -> Response | None:
        if expected is None:
            return None
        given = request.headers.get("authorization", "").encode()
        if hmac.compare_digest(given, expected):
            return None
        return _error_response(
            401, "missing or wrong API key: send 'Authorization: Bearer <api_key>'.", "invalid_api_key"
        )

    async def run(request: Request, create: Any, sdk_create: Any) -> Response:
        denied = unauthorized(request)
        if denied is not None:
            return denied
        try:
            body = await request.json()
        except ValueError:
            return _error_response(400, "the request body is not valid JSON.")
        if not isinstance(body, dict):
            return _error_response(400, "the request body must be a JSON object.")
        try:
            response = await create(**split_kwargs(body, sdk_create))
        except TypeError as exc:  # a missing required argument, as the SDK would report it
            return _error_response(400, str(exc))
        except Exception as exc:
            status, payload = error_body(exc)
            return JSONResponse(payload, status_code=status)
        return JSONResponse(response_json(response))

    async def chat(request: Request) -> Response:
        return await run(request, client.chat.completions.create, SDKChatCompletions.create)

    async def completions(request: Request) -> Response:
        return await run(request, client.completions.create, SDKCompletions.create)

    async def models(request: Request) -> Response:
        denied = unauthorized(request)
        if denied is not None:
            return denied
        page = await client.models.list()
        return JSONResponse({"object": "list", "data": [m.model_dump(mode="json") for m in page.data]})

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "model": client.model_name})

    async def not_found(request: Request, exc: Exception) -> Response:
        return _error_response(
            404, f"{request.method} {request.url.path} is not served here.", type_="not_found"
        )

    routes = [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
    ]
    return Starlette(routes=routes, exception_handlers={404: not_found, 405: not_found})


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, api_key: str | None) -> None:
    if not is_loopback(host) and not api_key:
        raise ConfigError(
            f"refusing to serve on non-loopback host '{host}' without an api_key; set api_key=<secret> "
            f"(clients then send it as a Bearer token) or bind host=127.0.0.1."
        )


class ServerThread:
    """A uvicorn server on its own event loop in a background thread (tests, notebooks, local agents)."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning") -> None:
        import uvicorn

        self._socket = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))
        self.host = host
        self.port: int = self._socket.getsockname()[1]
        config = uvicorn.Config(app, log_level=log_level, lifespan="off", access_log=False)
        self._server = uvicorn.Server(config)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"bridges-serve-{self.port}", daemon=True)
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"the server thread stopped before serving: {self._error!r}")
            self._thread.join(0.01)

    def _run(self) -> None:
        try:
            asyncio.run(self._server.serve(sockets=[self._socket]))
        except BaseException as exc:  # reported by the constructor
            self._error = exc

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def close(self, timeout: float = 10.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout)
        self._socket.close()

    def __enter__(self) -> ServerThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve_in_thread(
    client: Any,
    host: str = "127.0.0.1",
    port: int = 0,
    api_key: str | None = None,
    log_level: str = "warning",
) -> ServerThread:
    """Serve ``client`` on ``host:port`` (0 = a free port) in a background thread; returns the handle."""
    check_bind(host, api_key)
    return ServerThread(create_app(client, api_key=api_key), host=host, port=port, log_level=log_level)


def build_engine(config: ServeConfig) -> Any:
    """The engine named by ``config.engine`` (imported lazily; a missing backend is one sentence)."""
    import importlib

    target = ENGINES.get(config.engine)
    if target is None:
        raise ConfigError(f"unknown engine '{config.engine}'; choose one of: {', '.join(ENGINES)}.")
    module_name, cls_name = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"engine '{config.engine}' is not available here ({exc}).") from exc
    engine_cls = getattr(module, cls_name)
    kwargs: dict[str, Any] = {"device": config.device}
    if config.engine == "hf":
        kwargs["max_batch_size"] = config.max_batch_size
    return engine_cls.from_pretrained(config.model, **kwargs)


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    from bridges.client import EngineClient

    config = parse_config(ServeConfig, sys.argv[1:] if argv is None else argv)
    check_bind(config.host, config.api_key)
    engine = build_engine(config)
    client = EngineClient(
        engine,
        model_name=config.served_model_name or config.model,
        request_timeout=config.request_timeout,
        tool_parser=config.tool_parser,
    )
    app = create_app(client, api_key=config.api_key)
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
