"""Per-rollout sessions on ``bridges.serve``: a trainer or harness outside this process opens one per
rollout, hands its base URL to the agent, and reads the token-exact turns back when the agent is done.

    POST   /v1/sessions          {"max_calls": 64, "max_sampled_tokens": 65536, "sampling": {...}}
                                 -> 201 {"id", "base_url", "anthropic_base_url"}
    GET    /v1/sessions/{id}     -> the record: every answered call as a turn (prompt ids, sampled ids,
                                    logprobs, finish reason, weight version, message), and over_cap
    DELETE /v1/sessions/{id}     -> the same record; the session is closed (later calls: 410)
    POST   /s/{id}/v1/chat/completions | /responses | /messages,  GET /s/{id}/v1/models

Managing sessions takes the server's API key; calling one takes only its URL (the id is the
capability, as for the in-process loopback server). The calls are answered by
``bridges.agents.session_routes``, the same code the in-process server uses.

Bounds, so that no client can grow the server without limit: at most ``MAX_OPEN_SESSIONS`` open at
once (429 beyond); per session ``max_calls``, ``max_sampled_tokens`` and ``max_prompt_tokens`` (summed
over its calls: a multi-turn agent resends its history) up to the ``CEILINGS``; all sessions together
hold at most ``MEMORY_BUDGET`` bytes of records (``sessions.recorded_bytes``: 80 bytes a prompt token,
300 a sampled one, 750 more for each of its top_logprobs alternatives, measured on the hf engine);
a session with no call for ``IDLE_S`` is closed. At the default caps a session holds at most about
60 MB without top_logprobs. Caps hold under concurrent calls (``sessions.Reservation``): sampled tokens
never pass theirs (a call's ``max_tokens`` is clamped to what is left), prompts pass theirs by at most
the last admitted call's. A session's settings are checked when it opens by the rules its calls are
checked by (``session_sampling``), and what it keeps of them counts against the budget.

Its ``base_url`` starts with the server's ``public_url``, else the address it is bound to, never the
request's ``Host`` header (a client could otherwise point an agent's calls anywhere).
"""

from __future__ import annotations

from typing import Any

from bridges.agents import session_routes
from bridges.agents.session_routes import ROUTES, Reply
from bridges.agents.sessions import (
    MAX_CALLS,
    MAX_SAMPLED_TOKENS,
    Session,
    SessionRefusal,
    Sessions,
    TokenBudget,
    session_sampling,
    settings_bytes,
)

MAX_OPEN_SESSIONS = 1024
MAX_PROMPT_TOKENS = 524_288  # the default cap, summed over a session's calls
CEILINGS = {"max_calls": 1024, "max_sampled_tokens": 1_048_576, "max_prompt_tokens": 4_194_304}
MEMORY_BUDGET = 4 * 1024**3
IDLE_S = 900.0


def _starlette(reply: Reply) -> Any:
    from starlette.responses import Response

    headers = {"Allow": reply.allow} if reply.allow else None
    return Response(reply.body, status_code=reply.status, media_type=reply.content_type, headers=headers)


def _cap(body: dict[str, Any], key: str, default: int) -> int:
    """A cap the client asks for, from 1 to this server's ceiling (an integral float counts: JSON has one
    number type)."""
    value = body.get(key, default)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= CEILINGS[key]:
        raise SessionRefusal(400, f"'{key}' must be an integer from 1 to {CEILINGS[key]}.", "invalid_session")
    return value


def session_record(session: Session) -> dict[str, Any]:
    from bridges.envs.multiturn import turn_from_response

    turns = [turn_from_response(r).model_dump(mode="json") for r in session.responses]
    return {"id": session.id, "open": not session.closed, "over_cap": session.over_cap, "turns": turns}


class SessionEndpoints:
    """The session routes of one server, over its client; ``guard`` is the server's API-key check."""

    def __init__(self, client: Any, model: str, guard: Any, read_body: Any, public_url: str | None = None) -> None:
        self.client, self.model, self.guard, self.read_body = client, model, guard, read_body
        self.public_url = public_url.rstrip("/") if public_url else None
        self.sessions = Sessions(idle_s=IDLE_S, budget=TokenBudget(MEMORY_BUDGET))

    async def open(self, request: Any) -> Any:
        denied = self.guard(request)
        if denied is not None:
            return denied
        try:
            raw = await self.read_body(request)
            body = session_routes.parse_body(raw) if raw else {}  # no body is no settings; whitespace is not JSON
            self.sessions.close_idle()
            if len(self.sessions) >= MAX_OPEN_SESSIONS:
                raise SessionRefusal(429, f"{MAX_OPEN_SESSIONS} sessions are open, the most this server keeps; "
                                     "close finished ones with DELETE /v1/sessions/{id}.", "too_many_sessions")
            forced = session_sampling(body.get("sampling", {}))
            caps = (_cap(body, "max_calls", MAX_CALLS), _cap(body, "max_sampled_tokens", MAX_SAMPLED_TOKENS),
                    _cap(body, "max_prompt_tokens", MAX_PROMPT_TOKENS))
            unknown = sorted(set(body) - {"sampling", *CEILINGS})
            if unknown:
                raise SessionRefusal(400, f"'{unknown[0][:80]}' is not a session setting; a session takes sampling, "
                                     f"{', '.join(CEILINGS)}.", "invalid_session")
            held = settings_bytes(forced)  # the settings a session keeps count against the server's budget
            budget = self.sessions.budget
            if budget is not None and budget.used + held > budget.limit:
                raise SessionRefusal(429, f"this server's sessions hold {budget.limit / 2**30:.1f} GiB of records "
                                     "and settings, the most it keeps; close finished sessions.", "server_sessions_full")
        except SessionRefusal as refusal:
            return _starlette(session_routes.refusal_reply(refusal.status, refusal.message, refusal.code))
        session = self.sessions.open(self.client, self.model, forced, *caps)
        session.charge(held)
        root = f"{self.root_url(request)}/s/{session.id}"
        payload = {"id": session.id, "base_url": f"{root}/v1", "anthropic_base_url": root}
        return _starlette(session_routes.json_reply(201, payload))

    def root_url(self, request: Any) -> str:
        """Where clients reach this server: ``public_url``, else the address the server is bound to (the
        machine's name when bound to every interface), never the request's ``Host`` header, which the
        client chooses (a base_url built from it could send an agent's calls anywhere)."""
        if self.public_url:
            return self.public_url
        import socket

        host, port = request.scope.get("server") or ("127.0.0.1", 80)
        if host in ("0.0.0.0", "::", ""):
            host = socket.getfqdn()
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{port}"

    async def record(self, request: Any) -> Any:
        """GET: the session's record; DELETE: the same, and the session is closed."""
        denied = self.guard(request)
        if denied is not None:
            return denied
        try:
            session = self.sessions.find(request.path_params["session"])
        except SessionRefusal as refusal:
            return _starlette(session_routes.refusal_reply(refusal.status, refusal.message, refusal.code))
        if request.method == "DELETE":
            self.sessions.close(session)
        return _starlette(session_routes.json_reply(200, session_record(session)))

    async def call(self, request: Any) -> Any:
        route = session_routes.route_of(request.url.path)
        try:
            raw = await self.read_body(request)  # the server's own limit (413) applies
        except SessionRefusal as refusal:
            return _starlette(session_routes.refusal_reply(refusal.status, refusal.message, refusal.code,
                                                           route == "messages"))
        return _starlette(await session_routes.answer(self.sessions, request.path_params["session"], route, raw))

    async def models(self, request: Any) -> Any:
        return _starlette(session_routes.models(self.sessions, request.path_params["session"]))

    def routes(self) -> list[Any]:
        from starlette.routing import Route

        return [
            Route("/v1/sessions", self.open, methods=["POST"]),
            Route("/v1/sessions/{session}", self.record, methods=["GET", "DELETE"]),
            *(Route(f"/s/{{session}}/v1/{route}", self.call, methods=["POST"]) for route in ROUTES),
            Route("/s/{session}/v1/models", self.models, methods=["GET"]),
        ]
