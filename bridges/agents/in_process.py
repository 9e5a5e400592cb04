"""A session reached without a socket: an ``openai.AsyncOpenAI`` whose requests are handed to
``session_routes``, for code in this process that is given a client object rather than a URL.

Why it exists: code that calls the rollout's client through a layer that drops the token-id extras on
the way back (verifiers' client wrappers turn our responses into their own types) still needs the
engine's ids. A session keeps them, so that code gets a session too, and a session stays the one
record of what a rollout was served. The requests are the same bytes an agent in another program
sends, answered by the same handler (one body check, the same caps, the same refusals, the same
stream framing); only the loopback socket and the HTTP server are left out.

Why ``post`` is overridden: a caller that asks for the raw HTTP response (verifiers 0.3's
``client.post(..., cast_to=httpx.Response)``, which parses the body itself) would otherwise pay the
SDK's whole request path (request options, URL merging, headers, retries, httpx's client and models) on every call,
about twice what the session's own answer costs. Those calls are serialised as the SDK serialises
them and answered directly; every other call (typed results, streams, other routes) goes through the
SDK to the same handler by the in-process transport.
"""

from __future__ import annotations

import datetime
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import httpx2
import openai
import pydantic

from bridges.agents import session_routes
from bridges.agents.session_routes import Reply
from bridges.agents.sessions import Session, Sessions

_ROOT = "http://session.in-process"
_BOUND_ID = "bound"  # the path's session id of a client that serves the session bound to the caller's context
_BOUND: ContextVar[str] = ContextVar("bridges_bound_session", default="")


@contextmanager
def bound_to(session: Session) -> Iterator[None]:
    """Calls a ``bound_client`` makes from this context (and tasks it starts) are ``session``'s calls.

    Why: a client built per rollout costs what its caller's wrapper costs to build (verifiers' client
    wrapper: about 0.5 ms, more than a model call here); one client for all rollouts, told its session
    by the rollout's context, costs it once. A call from a task started inside the rollout that
    outlives it still names that session, which is closed by then: a 410, not another rollout's record.
    """
    token = _BOUND.set(session.id)
    try:
        yield
    finally:
        _BOUND.reset(token)


def _resolved(session_id: str) -> str:
    """A path's session id, the bound one (``bound_to``) where the path names no session of its own."""
    return _BOUND.get() if session_id == _BOUND_ID else session_id


def _raw_response_types() -> tuple[type, ...]:
    """The response classes a caller may ask for raw: httpx2's (the SDK's), and httpx's where the
    caller loaded httpx (it must have, to pass its class; never imported here), as the SDK decides."""
    legacy = sys.modules.get("httpx")
    return (httpx2.Response,) if legacy is None else (httpx2.Response, legacy.Response)


class _SessionTransport(httpx2.AsyncBaseTransport):
    """``/s/<id>/v1/<route>`` answered by ``session_routes``, as the loopback server answers it."""

    def __init__(self, sessions: Sessions) -> None:
        self.sessions = sessions

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        session_id, route = _split(request.url.path)
        session_id = _resolved(session_id)
        if request.method == "POST" and route in session_routes.ROUTES:
            reply = await session_routes.answer(self.sessions, session_id, route, await request.aread())
        elif request.method == "GET" and route == "models":
            reply = session_routes.models(self.sessions, session_id)
        else:
            message = f"{request.method} {request.url.path[:200]} is not served on a session."
            reply = session_routes.refusal_reply(404, message, "not_served")
        return _response(reply, request)


def _split(path: str) -> tuple[str, str]:
    """(session id, route) of ``/s/<id>/v1/<route>``; empty strings where the path is not one."""
    parts = path.split("/")  # ["", "s", id, "v1", *route]
    if len(parts) > 4 and parts[1] == "s" and parts[3] == "v1":
        return parts[2], "/".join(parts[4:])
    return "", ""


def _response(reply: Reply, request: httpx2.Request) -> httpx2.Response:
    return httpx2.Response(reply.status, headers={"content-type": reply.content_type}, content=reply.body,
                           request=request)


def _jsonable(value: Any) -> Any:
    """What the SDK's JSON encoder writes for the non-JSON values callers put in bodies."""
    if isinstance(value, pydantic.BaseModel):
        return value.model_dump(exclude_unset=True, mode="json", by_alias=True)
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def request_bytes(body: Any, extra_json: Any = None) -> bytes:
    """A request's JSON body as the SDK sends it: ``body`` with ``extra_json`` merged over it."""
    if extra_json:
        body = {**(body or {}), **extra_json}
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), default=_jsonable).encode()


class SessionClient(openai.AsyncOpenAI):
    """An ``AsyncOpenAI`` on one session, or (``session`` None) on the one ``bound_to`` the caller's
    context; raw-response POSTs skip the SDK's request path (module doc)."""

    def __init__(self, sessions: Sessions, session: Session | None = None) -> None:
        self._session_id = session.id if session is not None else _BOUND_ID
        super().__init__(
            api_key=session.id if session is not None else "in-process",
            base_url=f"{_ROOT}/s/{self._session_id}/v1",
            max_retries=0,  # a refused call (cap, closed session) must reach the caller, not be re-sent
            http_client=httpx2.AsyncClient(transport=_SessionTransport(sessions)),
        )
        self._session_sessions = sessions

    async def post(
        self,
        path: str,
        *,
        cast_to: Any,
        body: Any = None,
        options: Any = None,
        stream: bool = False,
        **rest: Any,
    ) -> Any:
        route = path.lstrip("/")
        extra = dict(options or {})
        direct = (not stream and not rest and route in session_routes.ROUTES and isinstance(cast_to, type)
                  and issubclass(cast_to, _raw_response_types()) and set(extra) <= {"headers", "extra_json"})
        if not direct:
            sdk_options: Any = options or {}
            return await super().post(path, cast_to=cast_to, body=body, options=sdk_options, stream=stream, **rest)
        try:
            raw = request_bytes(body, extra.get("extra_json"))
        except (TypeError, ValueError) as exc:  # as the SDK's own encoder would refuse it, before sending
            raise TypeError(f"the request body cannot be sent as JSON: {exc}") from None
        reply = await session_routes.answer(self._session_sessions, _resolved(self._session_id), route, raw)
        if reply.status >= 400:
            request = httpx2.Request("POST", f"{self.base_url}{route}")
            raise self._make_status_error_from_response(_response(reply, request))
        return cast_to(reply.status, content=reply.body)  # the body is JSON: no stream reaches here


def session_client(sessions: Sessions, session: Session) -> openai.AsyncOpenAI:
    """A client whose calls are ``session``'s calls: sampled by its rollout's client, recorded in it."""
    return SessionClient(sessions, session)


def bound_client(sessions: Sessions) -> openai.AsyncOpenAI:
    """One client for many rollouts: each call is the call of the session ``bound_to`` its context."""
    return SessionClient(sessions)
