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
import concurrent.futures
import itertools
import json
import re
import shutil
import sys
import threading
import uuid
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from fastapi import FastAPI, Request  # module level: FastAPI resolves the handlers' string annotations here
from fastapi.responses import JSONResponse, Response

from bridges.adapters.tinker.local_model import LocalModel, LoraPolicy
from bridges.adapters.tinker.requests import (
    MAX_LORA_RANK,
    check_adam,
    check_sample_request,
    json_body,
    plain_name,
)
from bridges.config import option, parse_config, run_cli
from bridges.state_files import (
    flatten_optimizer,
    load_tensors,
    save_tensors,
    unflatten_optimizer,
    verify_manifest,
    write_manifest,
)

PROTOBUF = "application/x-protobuf"
RETRIEVE_WAIT_S = 30.0  # under the SDK's 45 s poll timeout; it simply polls again
SAVE_KINDS = ("weights", "sampler_weights")
# the SDK derives a training client's id as "<session_id>:train:<model_seq_id>" and so must we
_MODEL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}(:train:[0-9]{1,9})?")


@dataclass
class TinkerServerConfig:
    model: str = option("tiny", help="'tiny', a local checkpoint folder or a hub id")
    model_name: str | None = option(None, help="the base_model name clients ask for (default: model)")
    host: str = option("127.0.0.1", help="bind address; a non-loopback one requires api_key")
    port: int = option(8000, ge=0, le=65535, help="port (0: a free one)")
    device: str = option("cpu", help="torch device")
    root: str = option("runs/tinker-server", help="where saves are written; no path a client names leaves it")
    api_key: str | None = option(None, help="required as X-API-Key (the SDK's TINKER_API_KEY) when set")
    log_level: str = option("warning", help="uvicorn's log level")


class TinkerState:
    """Sessions, training clients, samplers and saved weights; the model work runs on one thread."""

    def __init__(self, model: LocalModel, model_name: str, root: str | Path) -> None:
        self.model = model
        self.model_name = model_name
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.policies: dict[str, LoraPolicy] = {}
        self.sessions: set[str] = set()
        self.samplers: dict[str, tuple[str | None, dict[str, torch.Tensor] | None]] = {}
        self.futures: dict[str, concurrent.futures.Future[Any]] = {}
        self.worker = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="tinker-model")
        self._ids = itertools.count(1)
        self._pending_samples: list[tuple[dict[str, Any], concurrent.futures.Future[Any]]] = []
        self._pending_lock = threading.Lock()

    def new_id(self, kind: str) -> str:
        return f"{kind}-{next(self._ids)}-{uuid.uuid4().hex[:8]}"

    def submit(self, work: Any, *args: Any) -> str:
        request_id = self.new_id("req")
        self.futures[request_id] = self.worker.submit(work, *args)
        return request_id

    # -- paths: tinker://<model_id>/<kind>/<name> <-> <root>/<model_id>/<kind>/<name>/ (a save folder)
    def folder_for(self, path: str) -> Path:
        """The save folder of a tinker:// path; every part is a plain name and the result stays in root."""
        if not isinstance(path, str) or not path.startswith("tinker://"):
            raise ValueError(f"'{path!s:.120}' is not a tinker://<model_id>/<kind>/<name> path.")
        parts = path.removeprefix("tinker://").split("/")
        if len(parts) != 3 or parts[1] not in SAVE_KINDS:
            raise ValueError(
                f"'{path:.120}' is not a tinker://<model_id>/<kind>/<name> path with kind "
                f"{' or '.join(SAVE_KINDS)}."
            )
        model_id, kind, name = parts
        if not _MODEL_ID.fullmatch(model_id):
            raise ValueError(f"'{path:.120}' does not name a training client this server could have made.")
        return self._confined(model_id, kind, plain_name(name, "the save name"))

    def _confined(self, *parts: str) -> Path:
        root = self.root.resolve()
        folder = root.joinpath(*parts).resolve()
        if not folder.is_relative_to(root) or folder == root:
            raise ValueError("that path leaves this server's storage folder; it is refused.")
        return folder

    def model_id_for(self, body: dict[str, Any]) -> str:
        """The id the SDK expects (``<session_id>:train:<model_seq_id>``), built only from a session id
        this server issued and an integer, since the id becomes a folder name."""
        session_id, seq = body.get("session_id"), body.get("model_seq_id")
        if session_id is None:
            return self.new_id("model")
        if session_id not in self.sessions:
            raise ValueError(f"unknown session '{session_id!s:.80}'; create a session on this server first.")
        if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq < 10**9:
            raise ValueError(f"model_seq_id must be a non-negative integer, got {seq!r:.40}.")
        return f"{session_id}:train:{seq}"

    def known_model_id(self, model_id: Any) -> str:
        if not isinstance(model_id, str) or model_id not in self.policies:
            raise ValueError(f"no training client '{model_id!s:.80}' on this server.")
        return model_id

    def policy(self, model_id: Any) -> LoraPolicy:
        return self.policies[self.known_model_id(model_id)]

    def check_base(self, base_model: str | None) -> None:
        if base_model and base_model != self.model_name:
            raise ValueError(f"this server serves '{self.model_name}', not '{base_model!s:.80}'.")

    # -- work (runs on the model thread) ----------------------------------------------------------
    def create_model(self, body: dict[str, Any]) -> dict[str, Any]:
        self.check_base(body.get("base_model"))
        lora = body.get("lora_config") or {}
        rank = lora.get("rank", 32)
        if not isinstance(rank, int) or isinstance(rank, bool) or not 1 <= rank <= MAX_LORA_RANK:
            raise ValueError(
                f"lora_config.rank must be an integer from 1 to {MAX_LORA_RANK}, got {rank!r:.40}."
            )
        policy = self.model.new_policy(
            rank,
            train_attn=bool(lora.get("train_attn", True)),
            train_mlp=bool(lora.get("train_mlp", True)),
            train_unembed=bool(lora.get("train_unembed", True)),
            seed=lora.get("seed"),
        )
        model_id = self.model_id_for(body)
        self.policies[model_id] = policy
        return {"type": "create_model", "model_id": model_id}

    def save(self, model_id: str, path: str, with_optimizer: bool) -> dict[str, Any]:
        """Weights (safetensors), optimizer tensors (safetensors) and the rest (JSON), staged then renamed."""
        policy = self.policy(model_id)
        folder = self.folder_for(path)
        staging = folder.with_name(f".tmp-{folder.name}")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        save_tensors(staging / "weights.safetensors", policy.snapshot())
        meta: dict[str, Any] = {"rank": policy.rank, "steps": policy.steps}
        if with_optimizer and policy.optimizer is not None:
            tensors, meta["optimizer"] = flatten_optimizer(policy.optimizer.state_dict())
            save_tensors(staging / "optimizer.safetensors", tensors)
        (staging / "meta.json").write_text(json.dumps(meta))
        write_manifest(staging)
        shutil.rmtree(folder, ignore_errors=True)
        staging.rename(folder)
        return {"path": path}

    def read_save(self, path: str) -> tuple[dict[str, Any], dict[str, torch.Tensor], Path]:
        """(meta, weights, folder) of a save, after checking its manifest; never unpickles anything."""
        folder = self.folder_for(path)
        if not folder.is_dir():
            raise ValueError(f"no saved weights at '{path}'.")
        problem = verify_manifest(folder)
        if problem is not None:
            raise ValueError(f"the save at '{path}' is damaged: {problem}.")
        return (
            json.loads((folder / "meta.json").read_text()),
            load_tensors(folder / "weights.safetensors"),
            folder,
        )

    def load(self, body: dict[str, Any]) -> dict[str, Any]:
        meta, weights, folder = self.read_save(body.get("path"))  # type: ignore[arg-type]
        model_id = body.get("model_id")
        if model_id is None or model_id not in self.policies:  # load into a new training client
            created = self.create_model({**body, "lora_config": {"rank": int(meta["rank"])}})
            model_id = created["model_id"]
        policy = self.policy(model_id)
        policy.load(weights)
        policy.steps = int(meta.get("steps", 0))
        if body.get("optimizer") and "optimizer" in meta:
            policy.optimizer = torch.optim.AdamW(list(policy.trainable().values()))
            tensors = load_tensors(folder / "optimizer.safetensors")
            policy.optimizer.load_state_dict(unflatten_optimizer(tensors, meta["optimizer"]))
        return {"type": "load_weights", "path": body["path"], "model_id": model_id}

    def sampler_weights(self, body: dict[str, Any]) -> dict[str, Any]:
        model_id = body["model_id"]
        policy = self.policy(model_id)
        if body.get("sampling_session_seq_id") is not None or not body.get("path"):
            sampler_id = self.new_id("sampler")
            self.samplers[sampler_id] = (model_id, policy.snapshot())
            return {"type": "save_weights_for_sampler", "sampling_session_id": sampler_id}
        path = f"tinker://{model_id}/sampler_weights/{plain_name(body['path'], 'path')}"
        self.save(model_id, path, with_optimizer=False)
        return {"type": "save_weights_for_sampler", "path": path}

    def open_sampler(self, body: dict[str, Any]) -> str:
        """A sampling session over a saved path or the base model."""
        path = body.get("model_path")
        sampler_id = self.new_id("sampler")
        if path:
            meta, weights, folder = self.read_save(path)
            model_id = folder.parent.parent.name
            if model_id not in self.policies:  # weights from an earlier server run: give them a policy
                self.policies[model_id] = self.model.new_policy(
                    int(meta["rank"]), train_attn=True, train_mlp=True, train_unembed=True, seed=None
                )
            self.samplers[sampler_id] = (model_id, weights)
        else:
            self.check_base(body.get("base_model"))
            self.samplers[sampler_id] = (None, None)
        return sampler_id

    def submit_sample(self, body: dict[str, Any]) -> str:
        """Queue a sample request; requests waiting together run as one decode batch per sampler."""
        request_id = self.new_id("req")
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.futures[request_id] = future
        with self._pending_lock:
            self._pending_samples.append((body, future))
        self.worker.submit(self._drain_samples)
        return request_id

    def _drain_samples(self) -> None:
        from bridges.adapters.tinker.wire import sample_response

        with self._pending_lock:
            batch, self._pending_samples = self._pending_samples, []
        by_sampler: dict[str, list[tuple[dict[str, Any], concurrent.futures.Future[Any]]]] = defaultdict(list)
        for body, future in batch:
            try:
                sampler_id = body.get("sampling_session_id") or self.open_sampler(body)
                if sampler_id not in self.samplers:
                    raise ValueError(f"no sampling session '{sampler_id}' on this server.")
                if not any(chunk.get("tokens") for chunk in body["prompt"]["chunks"]):
                    raise ValueError("the prompt has no tokens.")
                by_sampler[sampler_id].append((body, future))
            except Exception as exc:
                future.set_exception(exc)
        for sampler_id, items in by_sampler.items():
            model_id, weights = self.samplers[sampler_id]
            policy = self.policies.get(model_id) if model_id else None
            prompts = [
                [t for chunk in body["prompt"]["chunks"] for t in chunk.get("tokens", [])]
                for body, _ in items
            ]
            try:
                requests = [
                    (p, int(body.get("num_samples", 1)), body["sampling_params"])
                    for p, (body, _) in zip(prompts, items, strict=True)
                ]
                results = self.model.sample(policy, weights, requests)
                for prompt, (body, future), sequences in zip(prompts, items, results, strict=True):
                    logprobs = (
                        self.model.prompt_logprobs(policy, weights, prompt)
                        if body.get("prompt_logprobs")
                        else None
                    )
                    future.set_result(sample_response(sequences, logprobs))
            except Exception as exc:  # every request of the batch learns of it
                for _, future in items:
                    if not future.done():
                        future.set_exception(exc)

    def forward_backward(self, raw: bytes) -> bytes:
        from bridges.adapters.tinker.wire import forward_backward_output, parse_forward_backward

        fields, data = parse_forward_backward(raw, self.model.vocab_size)
        policy = self.policy(fields["model_id"])
        logprobs, loss = self.model.forward_backward(
            policy, data, fields["loss_fn"], fields["loss_fn_config"], fields["forward_only"]
        )
        return forward_backward_output(logprobs, loss)


def create_app(state: TinkerState, api_key: str | None = None) -> Any:
    app = FastAPI(title="rl-bridges local Tinker server")

    if api_key:
        import hmac

        @app.middleware("http")
        async def require_key(request: Request, call_next: Any) -> Any:
            given = request.headers.get("x-api-key", "")
            if not hmac.compare_digest(given.encode(), api_key.encode()):
                message = "missing or wrong API key: send it as X-API-Key (TINKER_API_KEY for the SDK)."
                return JSONResponse({"detail": message}, status_code=401)
            return await call_next(request)

    def promise(request_id: str, **extra: Any) -> dict[str, Any]:
        return {"request_id": request_id, **extra}

    @app.middleware("http")
    async def refuse(request: Request, call_next: Any) -> Any:
        """Any failure is the request's: a 400 with its sentence, never a 500 the SDK would retry
        (an exception handler for Exception would answer, then re-raise and reset the connection)."""
        try:
            return await call_next(request)
        except Exception as exc:
            return JSONResponse({"detail": " ".join(str(exc).split()) or type(exc).__name__}, status_code=400)

    @app.get("/api/v1/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/api/v1/client/config")
    async def client_config() -> dict[str, Any]:
        return {"pjwt_auth_enabled": False}

    @app.post("/api/v1/client/dynamic_config")
    async def dynamic_config() -> dict[str, Any]:
        return {}

    @app.post("/api/v1/telemetry")
    async def telemetry() -> dict[str, Any]:
        return {"status": "accepted"}  # the SDK validates this shape (TelemetryResponse)

    @app.post("/api/v1/create_session")
    async def create_session() -> dict[str, Any]:
        session_id = state.new_id("session")
        state.sessions.add(session_id)
        return {"type": "create_session", "session_id": session_id}

    @app.post("/api/v1/session_heartbeat")
    async def heartbeat() -> dict[str, Any]:
        return {"type": "session_heartbeat"}

    @app.post("/api/v1/sessions/{session_id}/finish")
    async def finish(session_id: str) -> dict[str, Any]:
        return {}

    @app.get("/api/v1/get_server_capabilities")
    async def capabilities() -> dict[str, Any]:
        model = {"model_name": state.model_name, "max_context_length": state.model.max_context}
        return {"supported_models": [{**model, "trainable": True, "sampleable": True}]}

    @app.post("/api/v1/create_model")
    async def create_model(request: Request) -> dict[str, Any]:
        return promise(state.submit(state.create_model, await json_body(request)))

    @app.post("/api/v1/get_info")
    async def get_info(request: Request) -> dict[str, Any]:
        body = await json_body(request)
        policy = state.policy(body.get("model_id"))
        data = {
            "model_name": state.model_name,
            "tokenizer_id": state.model.path,
            "arch": state.model.base.config.model_type,
        }
        return {
            "type": "get_info",
            "model_id": body["model_id"],
            "model_data": data,
            "lora_rank": policy.rank,
        }

    @app.post("/api/v1/forward_backward")
    async def forward_backward(request: Request) -> dict[str, Any]:
        if "zstd" in request.headers.get("content-encoding", ""):
            raise ValueError(
                "compressed forward_backward bodies are not accepted; this server never asks for them."
            )
        return promise(state.submit(state.forward_backward, await request.body()))

    @app.post("/api/v1/optim_step")
    async def optim_step(request: Request) -> dict[str, Any]:
        body = await json_body(request)
        adam = check_adam(body.get("adam_params") or body.get("optim_params") or {})
        state.policy(body.get("model_id"))  # an unknown client: 400 now

        def work() -> dict[str, Any]:
            return {
                "type": "optim_step",
                "metrics": state.model.optim_step(state.policy(body.get("model_id")), adam),
            }

        return promise(state.submit(work))

    @app.post("/api/v1/save_weights")
    async def save_weights(request: Request) -> dict[str, Any]:
        body = await json_body(request)
        model_id = state.known_model_id(body.get("model_id"))
        name = plain_name(body.get("path") or state.new_id("state"), "path")
        path = f"tinker://{model_id}/weights/{name}"
        return promise(state.submit(lambda: {"type": "save_weights", **state.save(model_id, path, True)}))

    @app.post("/api/v1/load_weights")
    async def load_weights(request: Request) -> dict[str, Any]:
        return promise(state.submit(state.load, await json_body(request)))

    @app.post("/api/v1/save_weights_for_sampler")
    async def save_weights_for_sampler(request: Request) -> dict[str, Any]:
        return promise(state.submit(state.sampler_weights, await json_body(request)))

    @app.post("/api/v1/create_sampling_session")
    async def create_sampling_session(request: Request) -> dict[str, Any]:
        body = await json_body(request)
        sampler_id = await asyncio.wrap_future(state.worker.submit(state.open_sampler, body))
        return {"type": "create_sampling_session", "sampling_session_id": sampler_id}

    @app.get("/api/v1/samplers/{sampler_id}")
    async def get_sampler(sampler_id: str) -> dict[str, Any]:
        return {"sampler_id": sampler_id, "base_model": state.model_name}

    @app.post("/api/v1/asample")
    async def asample(request: Request) -> dict[str, Any]:
        body = check_sample_request(await json_body(request), state.model.vocab_size)
        ids = [state.new_id("seq") for _ in range(body.get("num_samples", 1))]
        return promise(state.submit_sample(body), sample_sequence_ids=ids)

    @app.post("/api/v1/retrieve_future")
    async def retrieve_future(request: Request) -> Any:
        body = await json_body(request)
        request_id = body.get("request_id")
        if not isinstance(request_id, str) or request_id not in state.futures:
            return JSONResponse({"detail": "unknown request_id"}, status_code=410)
        future = state.futures[request_id]
        # Wait without ever cancelling the job: asyncio.wait leaves the future alone on a timeout
        # (wait_for would cancel it, and a still-queued optim_step would be lost for good).
        await asyncio.wait([asyncio.wrap_future(future)], timeout=RETRIEVE_WAIT_S)
        if not future.done():
            return {"type": "try_again"}
        state.futures.pop(request_id, None)
        try:
            result = future.result()
        except BaseException as exc:  # the work failed (or was cancelled): terminal, RequestFailedError
            return {"error": " ".join(str(exc).split()) or type(exc).__name__, "category": "user"}
        if isinstance(result, bytes):
            return Response(content=result, media_type=PROTOBUF)
        return result

    return app


def build_state(config: TinkerServerConfig) -> TinkerState:
    from bridges.tiny import resolve_model_path

    return TinkerState(
        LocalModel(resolve_model_path(config.model), device=config.device),
        config.model_name or config.model,
        config.root,
    )


def serve_in_thread(config: TinkerServerConfig) -> Any:
    """Start the server on a background thread (``port=0``: a free port); returns the ``ServerThread``."""
    from bridges.http_server import ServerThread, check_bind

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

    from bridges.http_server import check_bind
    from bridges.preflight import check_model, check_writable_folder

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
