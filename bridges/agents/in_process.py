"""A session reached without a socket: an ``openai.AsyncOpenAI`` whose transport hands each request
to ``session_routes``, for code in this process that is given a client object rather than a URL.

Why it exists: code that calls the rollout's client through a layer that drops the token-id extras on
the way back (verifiers' client wrappers turn our responses into their own types) still needs the
engine's ids. A session keeps them, so that code gets a session too, and a session stays the one
record of what a rollout was served. The requests are the same bytes an agent in another program
sends, answered by the same handler (one body check, the same caps, the same refusals, the same
stream framing); only the loopback socket and the HTTP server are left out, which is most of a
session call's cost (``benchmarks/agent_sessions.py``).
"""

from __future__ import annotations

import httpx2
import openai

from bridges.agents import session_routes
from bridges.agents.session_routes import Reply
from bridges.agents.sessions import Session, Sessions

_ROOT = "http://session.in-process"


class _SessionTransport(httpx2.AsyncBaseTransport):
    """``/s/<id>/v1/<route>`` answered by ``session_routes``, as the loopback server answers it."""

    def __init__(self, sessions: Sessions) -> None:
        self.sessions = sessions

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        parts = request.url.path.split("/")  # ["", "s", id, "v1", *route]
        session_id = parts[2] if len(parts) > 4 and parts[1] == "s" and parts[3] == "v1" else ""
        route = "/".join(parts[4:])
        if request.method == "POST" and route in session_routes.ROUTES:
            reply = await session_routes.answer(self.sessions, session_id, route, await request.aread())
        elif request.method == "GET" and route == "models":
            reply = session_routes.models(self.sessions, session_id)
        else:
            message = f"{request.method} {request.url.path[:200]} is not served on a session."
            reply = session_routes.refusal_reply(404, message, "not_served")
        return _response(reply, request)


def _response(reply: Reply, request: httpx2.Request) -> httpx2.Response:
    return httpx2.Response(reply.status, headers={"content-type": reply.content_type}, content=reply.body,
                           request=request)  # fmt: skip


def session_client(sessions: Sessions, session: Session) -> openai.AsyncOpenAI:
    """A client whose calls are ``session``'s calls: sampled by its rollout's client, recorded in it."""
    return openai.AsyncOpenAI(
        api_key=session.id,
        base_url=f"{_ROOT}/s/{session.id}/v1",
        max_retries=0,  # a refused call (cap, closed session) must reach the caller, not be re-sent
        http_client=httpx2.AsyncClient(transport=_SessionTransport(sessions)),
    )
