"""Running an ASGI app: on a background thread (tests, notebooks, an in-process client), and the bind
policy every server of this library shares.

Bind policy: loopback by default, and a non-loopback host only with an API key, because an engine
(or a Tinker-compatible trainer) on an open port is free compute, and a writable one, for anyone who
finds it. Both ``bridges.serve`` and the local Tinker server use this module, so they cannot drift.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import socket
import threading
from typing import Any

from bridges.runtime.errors import ConfigError


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bearer_matches(request: Any, expected: bytes) -> bool:
    """Does the request's ``Authorization`` header equal ``expected`` (``b"Bearer <key>"``)? In constant
    time, so the comparison does not tell a caller how much of a guessed key was right."""
    return hmac.compare_digest(request.headers.get("authorization", "").encode(), expected)


def check_bind(host: str, api_key: str | None) -> None:
    if not is_loopback(host) and not api_key:
        raise ConfigError(
            f"refusing to serve on non-loopback host '{host}' without an api_key; set api_key=<secret> "
            f"(every client must then send it) or bind host=127.0.0.1."
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
