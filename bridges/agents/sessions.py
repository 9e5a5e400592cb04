"""Per-rollout sessions: one unguessable id per rollout, and every model call made under it recorded.

Invariant: a session's record holds exactly the responses its own calls were answered with, in the
order they were answered, each carrying the engine's prompt ids, sampled ids and logprobs. The
rollout's turns are read from that record, so what trains is what the engine sampled, whatever the
agent later did with the text. Why a session id rather than a header or the API key: an agent in
another program can be pointed at a base URL and nothing else (``OPENAI_BASE_URL``), and an id of
24 random bytes in that URL is both the route and the capability. One session cannot name another,
so it can neither read nor add to another rollout's record.

What a session refuses, each with one sentence: an unknown id (404); a closed one (410: its rollout
has ended, so a late call cannot change what was trained); a call past its cap on calls, on sampled
tokens or on prompt tokens summed over its calls (429; the rollout is then masked with that reason,
since an agent cut off mid-work is not the agent's episode). A server's sessions also share a budget
of recorded tokens (``TokenBudget``: what they hold in memory, 429 past it) and close after
``idle_s`` without a call (a crashed harness's sessions do not stay until restart).

The rollout's own sampling arguments (temperature, max_tokens, seed, what the backend adds) win
over what the agent asks for, and the model name the agent sends is ignored: the logprobs a trainer
uses must be those of the distribution the policy was sampled from.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from bridges.client.api_errors import error_body
from bridges.client.http_bodies import split_kwargs, tool_calls_problem
from bridges.envs.messages import to_message_dict, to_message_dicts

MAX_CALLS = 64
MAX_SAMPLED_TOKENS = 65_536
REMEMBERED_CLOSED = 4096  # closed ids kept so that a late call hears 410 rather than 404
# call k of a seeded rollout samples with seed + k * SEED_STRIDE: one seed for every call would replay
# the same random draws on each (a near-uniform policy then repeats its first reply word for word)
SEED_STRIDE = 1_000_003


# what one recorded token costs in memory (measured on the hf engine: ids, logprobs, the messages and
# the response objects kept per call; an alternative of top_logprobs is an object of its own)
BYTES_PER_PROMPT_TOKEN, BYTES_PER_SAMPLED_TOKEN, BYTES_PER_TOP_LOGPROB = 80, 300, 750


@dataclass
class TokenBudget:
    """The memory the open sessions of one server hold in their records (estimated bytes), against a limit."""

    limit: int
    used: int = 0


def recorded_bytes(response: Any, prompt: int, sampled: int) -> int:
    """The estimated memory of one recorded call (``BYTES_PER_*``)."""
    alternatives = 0
    for choice in getattr(response, "choices", None) or []:
        content = getattr(getattr(choice, "logprobs", None), "content", None) or []
        alternatives += sum(len(getattr(token, "top_logprobs", None) or []) for token in content)
    return BYTES_PER_PROMPT_TOKEN * prompt + BYTES_PER_SAMPLED_TOKEN * sampled + BYTES_PER_TOP_LOGPROB * alternatives


class SessionRefusal(Exception):
    """A call a session does not answer: the HTTP status and one sentence in OpenAI's error shape."""

    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": "invalid_request_error", "param": None,
                          "code": self.code}}


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
    max_prompt_tokens: int | None = None  # summed over calls (None: no cap, as in-process)
    budget: TokenBudget | None = None  # the server's, shared by its sessions
    # an agent framework fails on a call to an undeclared tool ("Tool not found"): its replies carry
    # only declared calls (``ChatRequest.declared_tools_only``). A harness that answers such a call
    # itself, as vLLM serves it (verifiers' environments), opens its sessions with False
    declared_tools_only: bool = True
    responses: list[Any] = field(default_factory=list)
    conversations: list[list[dict[str, Any]]] = field(default_factory=list)  # each answered call's messages
    sampled_tokens: int = 0
    prompt_tokens: int = 0
    held_bytes: int = 0  # recorded_bytes of its calls, counted against ``budget``
    calls_started: int = 0
    last_used: float = field(default_factory=time.monotonic)
    over_cap: str | None = None  # why the rollout is masked: the agent went past a cap
    closed: bool = False
    threads: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # Responses ids -> conversation

    def last_exchange(self) -> list[dict[str, Any]]:
        """The last answered call's messages followed by its reply (empty when none was answered)."""
        if not self.responses:
            return []
        return [*to_message_dicts(self.conversations[-1]), to_message_dict(self.responses[-1].choices[0].message)]

    def admit(self) -> None:
        """Count a call in, or refuse it (closed, or past a cap)."""
        if self.closed:
            raise closed_refusal()
        self.last_used = time.monotonic()
        if self.calls_started >= self.max_calls:
            self.over_cap = f"the agent made more than {self.max_calls} model calls (max_calls)."
        elif self.sampled_tokens >= self.max_sampled_tokens:
            self.over_cap = f"the agent's calls sampled more than {self.max_sampled_tokens} tokens (max_sampled_tokens)."
        elif self.max_prompt_tokens is not None and self.prompt_tokens >= self.max_prompt_tokens:
            self.over_cap = f"the agent's prompts summed to more than {self.max_prompt_tokens} tokens (max_prompt_tokens)."
        if self.over_cap is not None:
            raise SessionRefusal(429, f"this session is over its cap: {self.over_cap}", "session_cap")
        if self.budget is not None and self.budget.used >= self.budget.limit:
            raise SessionRefusal(429, f"this server's sessions hold {self.budget.limit / 2**30:.1f} GiB of records, "
                                 "the most it keeps; close finished sessions.", "server_sessions_full")
        self.calls_started += 1

    def record(self, messages: list[Any], response: Any) -> None:
        """Keep one answered call. ``messages`` are kept as sent (each request's own parsed body, never
        shared) and normalised when read: most rollouts never read them, and normalising costs about as
        much as recording."""
        if self.closed:  # answered after its rollout ended: the rollout's turns are already taken
            raise SessionRefusal(410, "this session closed while the call ran; nothing was recorded.",
                                 "session_closed")
        self.responses.append(response)
        self.conversations.append(messages)
        usage = getattr(response, "usage", None)
        sampled, prompt = int(getattr(usage, "completion_tokens", 0) or 0), int(getattr(usage, "prompt_tokens", 0) or 0)
        self.sampled_tokens, self.prompt_tokens = self.sampled_tokens + sampled, self.prompt_tokens + prompt
        self.last_used = time.monotonic()
        held = recorded_bytes(response, prompt, sampled)
        self.held_bytes += held
        if self.budget is not None:
            self.budget.used += held


class Sessions:
    """The open sessions of one server, by id, and the recently closed ones (for 410). ``idle_s``: a
    session with no call for that long is closed; ``budget``: the recorded tokens all may hold."""

    def __init__(self, idle_s: float | None = None, budget: TokenBudget | None = None) -> None:
        self._open: dict[str, Session] = {}
        self._closed: OrderedDict[str, None] = OrderedDict()
        self.idle_s, self.budget = idle_s, budget
        self._next_scan = 0.0  # idle sessions are looked for at most once a second

    def open(
        self, client: Any, model: str, forced: dict[str, Any], max_calls: int = MAX_CALLS,
        max_sampled_tokens: int = MAX_SAMPLED_TOKENS, max_prompt_tokens: int | None = None,
    ) -> Session:
        self.close_idle()
        session = Session(secrets.token_urlsafe(24), client, model, dict(forced), max_calls, max_sampled_tokens,
                          max_prompt_tokens, self.budget)
        self._open[session.id] = session
        return session

    def close(self, session: Session) -> None:
        session.closed = True
        if self._open.pop(session.id, None) is not None:
            if session.budget is not None:
                session.budget.used -= session.held_bytes
            self._closed[session.id] = None
            while len(self._closed) > REMEMBERED_CLOSED:
                self._closed.popitem(last=False)

    def close_idle(self) -> None:
        """Close the sessions with no call for ``idle_s`` (their harness crashed or forgot them)."""
        now = time.monotonic()
        if self.idle_s is None or now < self._next_scan:
            return
        self._next_scan, cutoff = now + 1.0, now - self.idle_s
        for session in [s for s in self._open.values() if s.last_used < cutoff]:
            self.close(session)

    def find(self, session_id: str) -> Session:
        self.close_idle()
        session = self._open.get(session_id)
        if session is not None:
            return session
        if session_id in self._closed:
            raise closed_refusal()
        raise SessionRefusal(404, "no session has this id; use the base URL your rollout was given.",
                             "session_not_found")

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
    if session.declared_tools_only:
        kwargs["extra_body"] = {**kwargs.get("extra_body", {}), "declared_tools_only": True}
    return kwargs


async def answer_chat(session: Session, body: dict[str, Any]) -> tuple[int, dict[str, Any] | None, Any]:
    """One Chat Completions call on ``session``, recorded when answered: (HTTP status, error JSON or
    None, the response or None). The response is handed back as the SDK object, not as JSON, so a
    caller that sends it as it is serialises it once (``response_bytes``)."""
    if not isinstance(body.get("messages"), list):
        return 400, SessionRefusal(400, "'messages' must be a list.", "invalid_messages").body(), None
    try:
        session.admit()
        kwargs = chat_arguments(session, body)
        response = await session.client.chat.completions.create(**kwargs)
        session.record(kwargs["messages"], response)
    except SessionRefusal as refusal:
        return refusal.status, refusal.body(), None
    except TypeError as exc:  # an argument the SDK's create does not take, as the SDK says it
        return 400, SessionRefusal(400, " ".join(str(exc).split()), "invalid_argument").body(), None
    except Exception as exc:  # the engine's refusal (400 prompt too long, 504 timeout...), as serve sends it
        return (*error_body(exc), None)
    return 200, None, response
