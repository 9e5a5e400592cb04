"""Per-rollout sessions: one unguessable id per rollout, and every model call made under it recorded.

Invariant: a session's record holds exactly the responses its own calls were answered with, in the
order they were answered, each carrying the engine's prompt ids, sampled ids and logprobs. The
rollout's turns are read from that record, so what trains is what the engine sampled, whatever the
agent later did with the text. Why a session id rather than a header or the API key: an agent in
another program can be pointed at a base URL and nothing else (``OPENAI_BASE_URL``), and an id of
24 random bytes in that URL is both the route and the capability. One session cannot name another,
so it can neither read nor add to another rollout's record.

What a session refuses, each with one sentence: an unknown id (404); a closed one (410: its rollout
has ended, so a late call cannot change what was trained); a call past its cap on calls or on
sampled tokens (429; the rollout is then masked with that reason, since an agent cut off mid-work
is not the agent's episode).

The rollout's own sampling arguments (temperature, max_tokens, seed, what the backend adds) win
over what the agent asks for, and the model name the agent sends is ignored: the logprobs a trainer
uses must be those of the distribution the policy was sampled from.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from bridges.client.api_errors import error_body
from bridges.client.http_bodies import response_json, split_kwargs, tool_calls_problem
from bridges.envs.messages import to_message_dict, to_message_dicts

MAX_CALLS = 64
MAX_SAMPLED_TOKENS = 65_536
REMEMBERED_CLOSED = 4096  # closed ids kept so that a late call hears 410 rather than 404
# call k of a seeded rollout samples with seed + k * SEED_STRIDE: one seed for every call would replay
# the same random draws on each (a near-uniform policy then repeats its first reply word for word)
SEED_STRIDE = 1_000_003


class SessionRefusal(Exception):
    """A call a session does not answer: the HTTP status and one sentence in OpenAI's error shape."""

    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": "invalid_request_error", "param": None,
                          "code": self.code}}  # fmt: skip


def closed_refusal() -> SessionRefusal:
    return SessionRefusal(410, "this session is closed: its rollout has ended.", "session_closed")


@dataclass(eq=False)
class Session:
    """One rollout's calls: what they were answered with, and the first cap they ran into."""

    id: str
    client: Any  # the rollout's openai.AsyncOpenAI (an EngineClient when training)
    model: str
    forced: dict[str, Any]  # the rollout's sampling arguments, which win over the agent's
    max_calls: int = MAX_CALLS
    max_sampled_tokens: int = MAX_SAMPLED_TOKENS
    responses: list[Any] = field(default_factory=list)
    conversations: list[list[dict[str, Any]]] = field(default_factory=list)  # each answered call's messages
    sampled_tokens: int = 0
    calls_started: int = 0
    over_cap: str | None = None  # why the rollout is masked: the agent went past a cap
    closed: bool = False
    threads: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # Responses ids -> conversation

    def last_exchange(self) -> list[dict[str, Any]]:
        """The last answered call's messages followed by its reply (empty when none was answered)."""
        if not self.responses:
            return []
        return [*self.conversations[-1], to_message_dict(self.responses[-1].choices[0].message)]

    def admit(self) -> None:
        """Count a call in, or refuse it (closed, or past a cap)."""
        if self.closed:
            raise closed_refusal()
        if self.calls_started >= self.max_calls:
            self.over_cap = f"the agent made more than {self.max_calls} model calls (max_calls)."
        elif self.sampled_tokens >= self.max_sampled_tokens:
            self.over_cap = f"the agent's calls sampled more than {self.max_sampled_tokens} tokens (max_sampled_tokens)."
        if self.over_cap is not None:
            raise SessionRefusal(429, f"this session is over its cap: {self.over_cap}", "session_cap")
        self.calls_started += 1

    def record(self, messages: list[dict[str, Any]], response: Any) -> None:
        if self.closed:  # answered after its rollout ended: the rollout's turns are already taken
            raise SessionRefusal(410, "this session closed while the call ran; nothing was recorded.",
                                 "session_closed")  # fmt: skip
        self.responses.append(response)
        self.conversations.append(messages)
        usage = getattr(response, "usage", None)
        self.sampled_tokens += int(getattr(usage, "completion_tokens", 0) or 0)


class Sessions:
    """The open sessions of one server, by id, and the recently closed ones (for 410)."""

    def __init__(self) -> None:
        self._open: dict[str, Session] = {}
        self._closed: OrderedDict[str, None] = OrderedDict()

    def open(
        self, client: Any, model: str, forced: dict[str, Any], max_calls: int = MAX_CALLS,
        max_sampled_tokens: int = MAX_SAMPLED_TOKENS,
    ) -> Session:  # fmt: skip
        session = Session(secrets.token_urlsafe(24), client, model, dict(forced), max_calls, max_sampled_tokens)
        self._open[session.id] = session
        return session

    def close(self, session: Session) -> None:
        session.closed = True
        if self._open.pop(session.id, None) is not None:
            self._closed[session.id] = None
            while len(self._closed) > REMEMBERED_CLOSED:
                self._closed.popitem(last=False)

    def find(self, session_id: str) -> Session:
        session = self._open.get(session_id)
        if session is not None:
            return session
        if session_id in self._closed:
            raise closed_refusal()
        raise SessionRefusal(404, "no session has this id; use the base URL your rollout was given.",
                             "session_not_found")  # fmt: skip

    def __len__(self) -> int:
        return len(self._open)


def chat_arguments(session: Session, body: dict[str, Any]) -> dict[str, Any]:
    """The ``create`` arguments for an agent's Chat Completions body: the agent's, under the rollout's
    sampling arguments and model; never streamed (a stream is re-cut from the recorded response)."""
    from openai.resources.chat.completions import AsyncCompletions

    problem = tool_calls_problem(body)
    if problem is not None:
        raise SessionRefusal(400, problem[1], "invalid_tool_calls")
    if body.get("n", 1) not in (1, None):  # the record keeps one reply per call; more would be sampled unseen
        raise SessionRefusal(400, "'n' must be 1 on a session: a rollout samples one reply per call.", "invalid_n")
    body = {k: v for k, v in body.items() if k not in ("stream", "stream_options", "model")}
    kwargs = split_kwargs(body, AsyncCompletions.create)
    for key, value in session.forced.items():
        if key == "seed" and isinstance(value, int) and not isinstance(value, bool):
            kwargs["seed"] = value + SEED_STRIDE * (session.calls_started - 1)
        elif key == "extra_body" and isinstance(value, dict):
            kwargs["extra_body"] = {**kwargs.get("extra_body", {}), **value}
        elif key != "n":
            kwargs[key] = value
    kwargs["model"] = session.model
    return kwargs


async def answer_chat(session: Session, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """(HTTP status, JSON) for one Chat Completions call on ``session``, recorded when answered."""
    if not isinstance(body.get("messages"), list):
        return 400, SessionRefusal(400, "'messages' must be a list.", "invalid_messages").body()
    try:
        session.admit()
        kwargs = chat_arguments(session, body)
        response = await session.client.chat.completions.create(**kwargs)
        session.record(to_message_dicts(kwargs["messages"]), response)
    except SessionRefusal as refusal:
        return refusal.status, refusal.body()
    except TypeError as exc:  # an argument the SDK's create does not take, as the SDK says it
        return 400, SessionRefusal(400, " ".join(str(exc).split()), "invalid_argument").body()
    except Exception as exc:  # the engine's refusal (400 prompt too long, 504 timeout...), as serve sends it
        return error_body(exc)
    return 200, response_json(response)
