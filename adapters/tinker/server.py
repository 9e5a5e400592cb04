"""A local Tinker-compatible server: ``python -m bridges.adapters.tinker.server model=tiny [port=8000]``.

It implements the endpoints the tinker 0.38 SDK calls (JSON, and protobuf where the SDK demands
it), backed by a real torch + peft LoRA model (``LocalModel``): sampling with logprobs,
``forward_backward`` for ``cross_entropy``/``importance_sampling``/``ppo``/``cispo``, AdamW
``optim_step``, and weights saved and loaded as files. Point the SDK at it with
``TINKER_BASE_URL=http://127.0.0.1:<port>`` and any ``TINKER_API_KEY`` starting with ``tml-``.

Every mutating call is a Tinker promise: the POST returns a ``request_id`` at once and the work
runs on one worker thread in arrival order (Tinker's per-client ordering); ``retrieve_future``
waits for it. A failure is answered as a terminal ``{"error": ..., "category": "user"}``, which
the SDK raises as ``RequestFailedError`` at once, never as an HTTP 500 it would retry for minutes.
Loopback by default; bound elsewhere it requires ``api_key`` (checked against the SDK's ``X-API-Key``
header), like ``bridges.serve``.
"""

from __future__ import annotations

import asyncio
import hmac
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request  # module level: FastAPI resolves the handlers' string annotations here
from fastapi.responses import JSONResponse, Response

from bridges.adapters.tinker.requests import check_adam, check_sample_request, json_body, plain_name
from bridges.adapters.tinker.state import TinkerServerConfig, TinkerState, build_state
from bridges.runs.config import parse_config, run_cli

PROTOBUF = "application/x-protobuf"
RETRIEVE_WAIT_S = 30.0  # under the SDK's 45 s poll timeout; it simply polls again


def promise(request_id: str, **extra: Any) -> dict[str, Any]:
    """A Tinker promise: the SDK polls ``retrieve_future`` with this id for the result."""
    return {"request_id": request_id, **extra}


class _Endpoints:
    """The request handlers over one ``TinkerState``; ``create_app`` only wires them to routes."""

    def __init__(self, state: TinkerState) -> None:
        self.state = state

    async def healthz(self) -> dict[str, Any]:
        return {"status": "ok"}

    async def client_config(self) -> dict[str, Any]:
        return {"pjwt_auth_enabled": False}

    async def empty(self) -> dict[str, Any]:
        return {}

    async def telemetry(self) -> dict[str, Any]:
        return {"status": "accepted"}  # the SDK validates this shape (TelemetryResponse)

    async def create_session(self) -> dict[str, Any]:
        session_id = self.state.new_id("session")
        self.state.sessions.add(session_id)
        return {"type": "create_session", "session_id": session_id}

    async def heartbeat(self) -> dict[str, Any]:
        return {"type": "session_heartbeat"}

    async def finish(self, session_id: str) -> dict[str, Any]:
        return {}

    async def capabilities(self) -> dict[str, Any]:
        model = {"model_name": self.state.model_name, "max_context_length": self.state.model.max_context}
        return {"supported_models": [{**model, "trainable": True, "sampleable": True}]}

    async def create_model(self, request: Request) -> dict[str, Any]:
        return promise(self.state.submit(self.state.create_model, await json_body(request)))

    async def get_info(self, request: Request) -> dict[str, Any]:
        body, state = await json_body(request), self.state
        policy = state.policy(body.get("model_id"))
        data = {"model_name": state.model_name, "tokenizer_id": state.model.path,
                "arch": state.model.base.config.model_type}
        return {
            "type": "get_info",
            "model_id": body["model_id"],
            "model_data": data,
            "lora_rank": policy.rank,
        }

    async def forward_backward(self, request: Request) -> dict[str, Any]:
        if "zstd" in request.headers.get("content-encoding", ""):
            raise ValueError(
                "compressed forward_backward bodies are not accepted; this server never asks for them."
            )
        return promise(self.state.submit(self.state.forward_backward, await request.body()))

    async def optim_step(self, request: Request) -> dict[str, Any]:
        body, state = await json_body(request), self.state
        adam = check_adam(body.get("adam_params") or body.get("optim_params") or {})
        model_id = body.get("model_id")
        state.policy(model_id)  # an unknown client: 400 now; looked up again when the step runs, in order

        def step() -> dict[str, Any]:
            return {"type": "optim_step", "metrics": state.model.optim_step(state.policy(model_id), adam)}

        return promise(state.submit(step))

    async def save_weights(self, request: Request) -> dict[str, Any]:
        body, state = await json_body(request), self.state
        model_id = state.known_model_id(body.get("model_id"))
        name = plain_name(body.get("path") or state.new_id("state"), "path")
        path = f"tinker://{model_id}/weights/{name}"
        return promise(state.submit(lambda: {"type": "save_weights", **state.save(model_id, path, True)}))

    async def load_weights(self, request: Request) -> dict[str, Any]:
        return promise(self.state.submit(self.state.load, await json_body(request)))

    async def save_weights_for_sampler(self, request: Request) -> dict[str, Any]:
        return promise(self.state.submit(self.state.sampler_weights, await json_body(request)))

    async def create_sampling_session(self, request: Request) -> dict[str, Any]:
        body = await json_body(request)
        sampler_id = await asyncio.wrap_future(self.state.worker.submit(self.state.open_sampler, body))
        return {"type": "create_sampling_session", "sampling_session_id": sampler_id}

    async def get_sampler(self, sampler_id: str) -> dict[str, Any]:
        return {"sampler_id": sampler_id, "base_model": self.state.model_name}

    async def asample(self, request: Request) -> dict[str, Any]:
        body = check_sample_request(await json_body(request), self.state.model.vocab_size)
        ids = [self.state.new_id("seq") for _ in range(body.get("num_samples", 1))]
        return promise(self.state.submit_sample(body), sample_sequence_ids=ids)

    async def retrieve_future(self, request: Request) -> Any:
        body = await json_body(request)
        request_id = body.get("request_id")
        if not isinstance(request_id, str) or request_id not in self.state.futures:
            return JSONResponse({"detail": "unknown request_id"}, status_code=410)
        future = self.state.futures[request_id]
        # Wait without ever cancelling the job: asyncio.wait leaves the future alone on a timeout
        # (wait_for would cancel it, and a still-queued optim_step would be lost for good).
        await asyncio.wait([asyncio.wrap_future(future)], timeout=RETRIEVE_WAIT_S)
        if not future.done():
            return {"type": "try_again"}
        self.state.futures.pop(request_id, None)
        try:
            result = future.result()
        except BaseException as exc:  # the work failed (or was cancelled): terminal, RequestFailedError
            return {"error": " ".join(str(exc).split()) or type(exc).__name__, "category": "user"}
        if isinstance(result, bytes):
            return Response(content=result, media_type=PROTOBUF)
        return result


async def _refuse(request: Request, call_next: Any) -> Any:
    """Any failure is the request's: a 400 with its sentence, never a 500 the SDK would retry (an
    exception handler for Exception would answer, then re-raise and reset the connection)."""
    try:
        return await call_next(request)
    except Exception as exc:
        return JSONResponse({"detail": " ".join(str(exc).split()) or type(exc).__name__}, status_code=400)


def _key_check(api_key: str) -> Any:
    async def require_key(request: Request, call_next: Any) -> Any:
        if not hmac.compare_digest(request.headers.get("x-api-key", "").encode(), api_key.encode()):
            message = "missing or wrong API key: send it as X-API-Key (TINKER_API_KEY for the SDK)."
            return JSONResponse({"detail": message}, status_code=401)
        return await call_next(request)

    return require_key


def create_app(state: TinkerState, api_key: str | None = None) -> Any:
    """The endpoints the tinker 0.38 SDK calls, over ``state``."""
    app = FastAPI(title="rl-bridges local Tinker server")
    if api_key:
        app.middleware("http")(_key_check(api_key))
    app.middleware("http")(_refuse)
    api = _Endpoints(state)
    routes: list[tuple[str, str, Callable[..., Any]]] = [
        ("GET", "healthz", api.healthz), ("POST", "client/config", api.client_config),
        ("POST", "client/dynamic_config", api.empty), ("POST", "telemetry", api.telemetry),
        ("POST", "create_session", api.create_session), ("POST", "session_heartbeat", api.heartbeat),
        ("POST", "sessions/{session_id}/finish", api.finish), ("GET", "get_server_capabilities", api.capabilities),
        ("POST", "create_model", api.create_model), ("POST", "get_info", api.get_info),
        ("POST", "forward_backward", api.forward_backward), ("POST", "optim_step", api.optim_step),
        ("POST", "save_weights", api.save_weights), ("POST", "load_weights", api.load_weights),
        ("POST", "save_weights_for_sampler", api.save_weights_for_sampler),
        ("POST", "create_sampling_session", api.create_sampling_session),
        ("GET", "samplers/{sampler_id}", api.get_sampler), ("POST", "asample", api.asample),
        ("POST", "retrieve_future", api.retrieve_future),
    ]
    for method, path, handler in routes:
        app.add_api_route(f"/api/v1/{path}", handler, methods=[method])
    return app


def serve_in_thread(config: TinkerServerConfig) -> Any:
    """Start the server on a background thread (``port=0``: a free port); returns the ``ServerThread``."""
    from bridges.runtime.http_server import ServerThread, check_bind

    check_bind(config.host, config.api_key)
    app = create_app(build_state(config), config.api_key)
    return ServerThread(app, host=config.host, port=config.port, log_level=config.log_level)


def start_local_server(model: str, root: str | Path, model_name: str | None = None) -> Any:
    """The local server on a free loopback port for an in-process client, with the SDK pointed at no
    key of its own (``tml-local``) and telemetry off; returns the ``ServerThread`` (``.url``, ``.close()``)."""
    import os

    server = serve_in_thread(TinkerServerConfig(model=model, model_name=model_name, port=0, root=str(root)))
    os.environ.setdefault("TINKER_API_KEY", "tml-local")
    os.environ.setdefault("TINKER_TELEMETRY", "0")
    return server


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    from bridges.runs.preflight import check_model, check_writable_folder
    from bridges.runtime.http_server import check_bind

    config = parse_config(TinkerServerConfig, sys.argv[1:] if argv is None else argv)
    check_bind(config.host, config.api_key)
    check_model(config.model)
    check_writable_folder(Path(config.root), "root")
    app = create_app(build_state(config), config.api_key)
    print(
        f"local Tinker server for '{config.model_name or config.model}' on http://{config.host}:{config.port}"
    )
    print(
        f"  TINKER_BASE_URL=http://{config.host}:{config.port} TINKER_API_KEY={config.api_key or 'tml-local'}"
    )
    uvicorn.run(app, host=config.host, port=config.port, log_level=config.log_level)
    return 0


if __name__ == "__main__":
    run_cli(main)
