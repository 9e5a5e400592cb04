"""What a session answers, whatever HTTP server carries it: bytes in, status and bytes out.

Two servers carry sessions — the loopback one inside a training process (aiohttp, in the rollouts'
event loop) and ``bridges.serve`` (Starlette) — and both hand each request here, so a session
behaves the same on either: one place parses bodies, refuses in one sentence, translates dialects
and frames streams.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from bridges.agents import anthropic_dialect, responses_dialect
from bridges.agents.sessions import Session, SessionRefusal, Sessions, answer_chat
from bridges.agents.streams import chat_stream, sse
from bridges.client.http_bodies import response_bytes, response_json
from bridges.runtime import json_rules

DIALECTS = {"responses": responses_dialect, "messages": anthropic_dialect}
ROUTES = ("chat/completions", "responses", "messages")


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    content_type: str = "application/json"
    allow: str | None = None  # for a 405


def route_of(path: str) -> str:
    """``chat/completions``, ``responses`` or ``messages`` from ``/s/<id>/v1/<route>``."""
    return path.split("/v1/", 1)[1]


def json_reply(status: int, payload: dict[str, Any]) -> Reply:
    return Reply(status, json.dumps(payload, ensure_ascii=False).encode())


def refusal_reply(status: int, message: str, code: str, anthropic: bool = False) -> Reply:
    body = SessionRefusal(status, message, code).body()
    return json_reply(status, anthropic_dialect.error_shape(body) if anthropic else body)


# a session answers with its own model whatever a chat call names, but a name that is not text is refused
CHAT_FIELD_TYPES: dict[str, tuple[str, ...]] = {"model": ("string",)}
_JSON_TYPES: dict[str, Any] = {"string": str, "array": list, "object": dict, "boolean": bool,
                               "integer": int, "number": (int, float)}


def check_field_types(body: dict[str, Any], types: dict[str, tuple[str, ...]]) -> None:
    """Each listed field, when present and not null, of one of its JSON types (a bool is no number)."""
    for key, allowed in types.items():
        value = body.get(key)
        if value is None:
            continue
        is_bool = isinstance(value, bool)
        integral = isinstance(value, float) and value.is_integer()  # JSON's 1.0 is the integer 1
        if not any((isinstance(value, _JSON_TYPES[t]) or (t == "integer" and integral)) and (t == "boolean" or not is_bool)
                   for t in allowed):
            raise SessionRefusal(400, f"'{key}' must be {' or '.join(allowed)}.", "invalid_type")


def parse_body(raw: bytes) -> dict[str, Any]:
    """The request's JSON object, held to the server's one JSON rule (``bridges.runtime.json_rules``:
    depth, valid Unicode), or the refusal that says why not."""
    try:
        body = json_rules.loads(raw)
    except json_rules.JsonRuleError as exc:
        raise SessionRefusal(400, str(exc), "invalid_json") from None
    if not isinstance(body, dict):
        raise SessionRefusal(400, "the request body must be a JSON object.", "invalid_json")
    return body


async def answer(sessions: Sessions, session_id: str, route: str, raw: bytes) -> Reply:
    """One POST on ``/s/<session_id>/v1/<route>``."""
    anthropic = route == "messages"
    dialect = DIALECTS.get(route)
    try:
        session = sessions.find(session_id)
        body = parse_body(raw)
        check_field_types(body, dialect.FIELD_TYPES if dialect is not None else CHAT_FIELD_TYPES)
        chat = dialect.to_chat(body, session) if dialect is not None else body
    except SessionRefusal as refusal:
        return refusal_reply(refusal.status, refusal.message, refusal.code, anthropic)
    except (TypeError, ValueError, AttributeError, KeyError, IndexError):  # a shape deeper than the checks
        name = dialect.NAME if dialect is not None else "Chat Completions"
        return refusal_reply(400, f"the request body is not a well-formed {name} request.", "invalid_request",
                             anthropic)
    status, error, response = await answer_chat(session, chat)
    if error is not None:
        return json_reply(status, anthropic_dialect.error_shape(error) if anthropic else error)
    if dialect is None:
        return chat_reply(response, body)
    payload = response_json(response)
    translated = dialect.from_chat(payload, body, session)
    if not body.get("stream"):
        return json_reply(200, translated)
    return Reply(200, sse(dialect.events(translated), named=True), "text/event-stream")


def chat_reply(response: Any, body: dict[str, Any]) -> Reply:
    """An answered Chat Completions call as sent: the JSON serialised once, or (``stream``) the recorded
    reply cut into server-sent chunks. Every chat surface (sessions, the verifiers v1 endpoint) sends this."""
    if not body.get("stream"):
        return Reply(200, response_bytes(response))
    return Reply(200, chat_stream(response_json(response), body), "text/event-stream")


def models(sessions: Sessions, session_id: str) -> Reply:
    """``GET /s/<session_id>/v1/models``: the one model a session answers with."""
    try:
        session: Session = sessions.find(session_id)
    except SessionRefusal as refusal:
        return refusal_reply(refusal.status, refusal.message, refusal.code)
    card = {"id": session.model, "object": "model", "created": 0, "owned_by": "rl-bridges"}
    return json_reply(200, {"object": "list", "data": [card]})
