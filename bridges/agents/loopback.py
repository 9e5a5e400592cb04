"""The HTTP face of per-rollout sessions inside a training or evaluation process.

One server per event loop, bound to 127.0.0.1 on a free port, open while any rollout of that loop
runs (``LoopbackServers.enter``): the rollouts' clients belong to that loop (an engine's batching
tasks, an HTTP pool), so the server answering their calls must run in it too, and opening one per
rollout would cost a port and a start-up each time. Routes, under ``/s/<session id>/v1``: Chat
Completions, Responses and Anthropic Messages (each streamed or not), and ``/models``. Every refusal is a 4xx in OpenAI's error shape; a
body over ``MAX_BODY_BYTES`` is a 413.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from bridges.agents import session_routes
from bridges.agents.session_routes import ROUTES, Reply
from bridges.agents.sessions import Session, Sessions

MAX_BODY_BYTES = 8 * 1024 * 1024
SESSION_ROOT = "/s/{session}/v1"


def _response(web: Any, reply: Reply) -> Any:
    response = web.Response(status=reply.status, body=reply.body, content_type=reply.content_type)
    if reply.allow is not None:
        response.headers["Allow"] = reply.allow
    return response


class LoopbackServer:
    """Sessions served over HTTP on loopback, in the event loop that started the server."""

    def __init__(self) -> None:
        self.sessions = Sessions()
        self.root = ""
        self._runner: Any = None

    def base_url(self, session: Session) -> str:
        """The OpenAI-style base URL (ending ``/v1``) of ``session``."""
        return f"{self.session_root(session)}/v1"

    def session_root(self, session: Session) -> str:
        """The URL without ``/v1``: what Anthropic's SDK takes as its base URL (it appends ``/v1/...``)."""
        return f"{self.root}/s/{session.id}"

    async def start(self) -> None:
        from aiohttp import web

        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_json_errors(web)])
        for route in ROUTES:
            app.router.add_post(f"{SESSION_ROOT}/{route}", self._post)
        app.router.add_get(f"{SESSION_ROOT}/models", self._models)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.root = f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def aclose(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _post(self, request: Any) -> Any:
        from aiohttp import web

        route = session_routes.route_of(request.path)
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _response(web, session_routes.refusal_reply(
                413, f"the request body is larger than {MAX_BODY_BYTES} bytes.", "body_too_large", route == "messages"
            ))
        return _response(web, await session_routes.answer(self.sessions, request.match_info["session"], route, raw))

    async def _models(self, request: Any) -> Any:
        from aiohttp import web

        return _response(web, session_routes.models(self.sessions, request.match_info["session"]))


def _json_errors(web: Any) -> Any:
    """aiohttp's own 404/405 (and any other HTTP exception) in OpenAI's error shape, ``Allow`` kept."""

    @web.middleware
    async def middleware(request: Any, handler: Any) -> Any:
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            message = f"{request.method} {request.path[:200]} is not served here ({exc.reason})."
            reply = session_routes.refusal_reply(exc.status, message, "not_served")
            return _response(web, Reply(reply.status, reply.body, allow=exc.headers.get("Allow")))

    return middleware


@dataclass(eq=False)
class _Held:
    loop: Any
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    server: LoopbackServer | None = None
    users: int = 0


class LoopbackServers:
    """One ``LoopbackServer`` per event loop, open while any rollout of that loop is inside ``enter``."""

    def __init__(self) -> None:
        self._by_loop: dict[int, _Held] = {}

    @contextlib.asynccontextmanager
    async def enter(self) -> AsyncIterator[LoopbackServer]:
        loop = asyncio.get_running_loop()
        held = self._by_loop.get(id(loop))
        if held is None or held.loop is not loop:  # none yet, or one left by a closed loop of the same id
            held = self._by_loop[id(loop)] = _Held(loop)
        async with held.lock:
            if held.server is None:
                server = LoopbackServer()
                await server.start()
                held.server = server
            held.users += 1
            server = held.server
        try:
            yield server
        finally:
            async with held.lock:
                held.users -= 1
                if held.users == 0 and held.server is not None:
                    held.server = None
                    if self._by_loop.get(id(loop)) is held:  # a backend with a loop per trajectory
                        del self._by_loop[id(loop)]  # must not accumulate one entry per closed loop
                    await server.aclose()
