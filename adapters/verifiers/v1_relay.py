"""verifiers' model ``Client`` answered by our endpoint in this process: the interception server's
upstream hop without HTTP.

Every model call of a v1 rollout goes harness → verifiers' interception server → the server's model
client → the engine. verifiers picks that client by config type only (its ``EvalClient`` relays over
HTTP), so our endpoint was a loopback server: each call paid a second HTTP exchange, and httpx's
pool, which scans every open connection on each request, cost more as rollouts ran together (half a
rollout's CPU at 64 at once). verifiers' server keeps one client per endpoint config, made on the
first session that names it (``InterceptionServer.clients``, keyed by the config's JSON); ``install``
puts this one there first. It asks ``SessionEndpoint.answer`` — the code the HTTP route runs, so the
same sessions, seeds, caps and refusals — and hands verifiers the reply as ``EvalClient`` would have
parsed it from the wire: the same JSON, the same ``model_error`` on a refusal.

Where the env's interception is a pool of servers (``env_args.interception.type``), whose servers
and clients come and go per rollout, the HTTP route still serves every call.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Mapping
from typing import Any

from pydantic import ValidationError

from bridges.adapters.verifiers.v1_endpoint import SessionEndpoint
from bridges.agents.session_routes import chat_reply
from bridges.client.http_bodies import response_json
from bridges.runtime.errors import require_extra

require_extra("verifiers", "verifiers", "verifiers v1 tasksets")  # one sentence when it is missing
from verifiers.v1.clients import Client  # noqa: E402
from verifiers.v1.clients.client import RelayReply  # noqa: E402
from verifiers.v1.errors import model_error  # noqa: E402
from verifiers.v1.interception import InterceptionServer  # noqa: E402

CHAT_PATH = "/chat/completions"  # the upstream path of verifiers' chat dialect; the endpoint answers no other
_SSE_EVENT = re.compile(rb"(?<=\n\n)")  # our streams end every event with one blank line


class EndpointRelay(Client):
    """verifiers' ``Client`` for one engine client of ours: each call answered by ``endpoint`` in
    this process (module doc)."""

    def __init__(self, endpoint: SessionEndpoint, client: Any) -> None:
        self.endpoint, self.client = endpoint, client

    async def get_response(self, dialect: Any, body: dict, sampling: Any, session_id: str | None = None,
                           turn: Any = None, headers: Mapping[str, str] | None = None) -> Any:
        raw = response_json(await self._answer(dialect, body, session_id))  # the JSON the wire would carry
        try:
            response = dialect.parse_response(dialect.validate_response(raw))
        except (ValueError, ValidationError) as exc:  # as EvalClient maps a reply it cannot read
            raise model_error(f"malformed upstream response: {type(exc).__name__}: {exc}", status_code=502) from exc
        response.raw = raw
        return response

    async def relay(self, dialect: Any, body: dict, session_id: str | None = None,
                    headers: Mapping[str, str] | None = None) -> RelayReply:
        """A streamed call (verifiers 0.4's programs stream): the recorded reply cut into events, one
        chunk each, as ``EvalClient`` hands them over."""
        reply = chat_reply(await self._answer(dialect, body, session_id), body)

        async def events() -> AsyncIterator[bytes]:
            for event in _SSE_EVENT.split(reply.body):
                if event:
                    yield event

        async def close() -> None:
            return None

        return RelayReply(content_type=reply.content_type, chunks=events(), close=close)

    async def relay_aux(self, dialect: Any, route: str, body: dict,
                        headers: Mapping[str, str] | None = None) -> dict:
        raise _not_served(route)

    async def _answer(self, dialect: Any, body: dict, session_id: str | None) -> Any:
        """The engine's response to ``body`` (a copy: verifiers keeps its own), or the refusal raised as
        ``EvalClient`` raises an upstream error status."""
        if dialect.upstream_path != CHAT_PATH:
            raise _not_served(dialect.upstream_path)
        status, error, response = await self.endpoint.answer(self.client, dict(body), session_id or "")
        if error is not None:
            raise model_error(f"upstream {status}: {json.dumps(error)}", status_code=status)
        return response


def _not_served(path: str) -> Exception:
    """The 404 ``EvalClient`` would have raised for a route the endpoint does not serve, naming it."""
    return model_error(f"upstream 404: the rollout's endpoint answers {CHAT_PATH} only, not {path}.", status_code=404)


def install(interception: Any, config: Any, endpoint: SessionEndpoint, client: Any) -> bool:
    """Make ``interception`` answer sessions of endpoint ``config`` through ``EndpointRelay``, where it
    is one server (module doc); whether it did. A config already served keeps its client."""
    if not isinstance(interception, InterceptionServer):
        return False
    key = config.model_dump_json()
    if key not in interception.clients:  # asked once per episode: a relay is made once per config
        interception.clients[key] = EndpointRelay(endpoint, client)
    return True
