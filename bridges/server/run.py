"""Serve one engine over HTTP (``python -m bridges.serve``): the options, the engine they name (hf or
vLLM, each placed its own way), the client over it, and uvicorn in the foreground.

Safety: the server binds loopback by default and refuses a non-loopback host without an ``api_key``:
an engine on an open port is free compute for anyone who finds it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bridges.client.families import FAMILY_NAMES
from bridges.client.tool_calls import TOOL_PARSERS
from bridges.models.hardware import DEVICE_HELP, check_device, resolve_device
from bridges.runs.config import option
from bridges.runs.engines import ENGINES, load_engine
from bridges.runtime.errors import ConfigError
from bridges.runtime.http_server import check_bind
from bridges.server.app import ServeLimits, WeightUpdates, create_app
from bridges.server.weights import DEFAULT_MAX_WEIGHTS_BYTES


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
    weights_key: str | None = option(
        None,
        help="a trainer may push new weights to POST /v1/weights under 'Authorization: Bearer <weights_key>'",
    )
    max_weights_bytes: int = option(
        DEFAULT_MAX_WEIGHTS_BYTES, ge=1024, help="larger weight pushes are refused with 413"
    )
    channel_hosts: str | None = option(
        None, help="comma-separated trainer hosts a weight channel may join besides the address its request came from"
    )
    access_log: bool = option(True, help="one line per request on stderr: method, path, status, latency")
    public_url: str | None = option(
        None, help="the URL clients reach this server at (behind a proxy or NAT): sessions' base_url starts with "
        "it; default: the bound address (the machine's name when bound to all interfaces), never a Host header",
    )
    log_level: str = option("warning", help="uvicorn's log level")


def engine_options(config: ServeConfig) -> dict[str, Any]:
    """What the named engine is built with: the hf engine takes a device and a batch size; vLLM places
    itself (``CUDA_VISIBLE_DEVICES``, its own parallelism settings) and takes no device argument."""
    if config.engine == "hf":
        return {"device": resolve_device(config.device), "max_batch_size": config.max_batch_size}
    return {}


def build_engine(config: ServeConfig) -> Any:
    """The engine named by ``config.engine``, from the engine table (a missing extra is one sentence)."""
    return load_engine(config.engine, config.model, **engine_options(config))


def identity(config: ServeConfig, engine: Any) -> dict[str, str]:
    """What ``/health`` tells a trainer about this server's model: its tensor layout and vocabulary."""
    from bridges.models.tiny import resolve_model_path
    from bridges.models.weight_payload import model_layout, tokenizer_fingerprint

    return {
        "layout": model_layout(resolve_model_path(config.model)),
        "tokenizer": tokenizer_fingerprint(engine.tokenizer),
    }


def serve(config: ServeConfig) -> int:
    import uvicorn

    from bridges.client import EngineClient

    check_bind(config.host, config.api_key)
    if config.weights_key is not None and config.weights_key == config.api_key:
        raise ConfigError("weights_key must differ from api_key: whoever may sample could change the weights.")
    names = tuple(n.strip() for n in (config.served_model_name or config.model).split(",") if n.strip())
    if not names:
        raise ConfigError("served_model_name names no model; give one name or comma-separated names.")
    if config.engine == "hf":
        from bridges.runs.preflight import check_model

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
    limits = ServeLimits(names, config.max_body_bytes, config.max_n, config.access_log, config.public_url)
    hosts = tuple(h.strip() for h in (config.channel_hosts or "").split(",") if h.strip())
    updates = WeightUpdates(
        config.weights_key, engine.model if config.engine == "hf" else None, config.max_weights_bytes, hosts
    )
    app = create_app(
        client, api_key=config.api_key, limits=limits, updates=updates, identity=identity(config, engine)
    )
    print(
        f"serving '{client.model_name}' ({config.engine} engine) at http://{config.host}:{config.port}/v1",
        flush=True,
    )
    # uvicorn's own access lines would print session ids; ours (access_log) masks them
    uvicorn.run(app, host=config.host, port=config.port, log_level=config.log_level, access_log=False)
    _leave_hung_joins()
    return 0


def _leave_hung_joins() -> None:
    """A weight channel join hung on a peer that never answers (``weights.CHANNEL_THREADS``) holds a thread
    inside torch's C++ store client, which cannot be interrupted; letting the interpreter shut down
    under it can abort the process. Such a server exits at once instead, saying so."""
    import os
    import sys

    from bridges.server.weights import CHANNEL_THREADS

    if CHANNEL_THREADS.threads_running:
        print("a weight channel join still waits on a peer that never answered; exiting without it.",
              file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(0)
