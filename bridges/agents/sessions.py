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
since an agent cut off mid-work is not the agent's episode). Caps hold under concurrent calls: a call
reserves its share when admitted (``Reservation``): its ``max_tokens``, clamped to what the sampled
cap leaves after every call in flight (so sampled tokens never pass the cap), and an upper bound of its
prompt (its text's UTF-8 bytes), so a call is admitted only while the prompts recorded and in flight
are below the cap (the last admitted call may pass it by its own prompt, never by more). A server's sessions also share a budget
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


@dataclass(frozen=True)
class Reservation:
    """What one admitted call may still take from its session's caps: its index among the session's calls
    (its seed's offset), the tokens it may sample, and an upper bound of its prompt."""

    call: int
    sampled: int
    prompt: int


def prompt_bound(messages: Any, tools: Any) -> int:
    """An upper bound of a prompt's tokens: its text's UTF-8 bytes (a byte-level vocabulary's token covers at
    least one byte) and the tools' JSON, plus 16 a message for the template's markers."""
    import json

    text = json.dumps([messages, tools], ensure_ascii=False, default=str)
    return len(text.encode("utf-8", "surrogatepass")) + 16 * (len(messages) if isinstance(messages, list) else 1)


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
    reserved_sampled: int = 0  # max_tokens of the calls in flight
    reserved_prompt: int = 0  # upper bounds of the prompts in flight
    held_bytes: int = 0  # recorded_bytes of its calls and its settings, counted against ``budget``
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

    def admit(self, max_tokens: int | None, prompt_bound: int) -> Reservation:
        """Count a call in with its reservation, or refuse it (closed, or past a cap). ``max_tokens``: what
        the call may sample (None: as much as the engine allows); ``prompt_bound``: its prompt at most."""
        if self.closed:
            raise closed_refusal()
        self.last_used = time.monotonic()
        room = self.max_sampled_tokens - self.sampled_tokens - self.reserved_sampled
        if self.calls_started >= self.max_calls:
            self.over_cap = f"the agent made more than {self.max_calls} model calls (max_calls)."
        elif room <= 0:
            self.over_cap = f"the agent's calls sampled more than {self.max_sampled_tokens} tokens (max_sampled_tokens)."
        elif self.max_prompt_tokens is not None and self.prompt_tokens + self.reserved_prompt >= self.max_prompt_tokens:
            self.over_cap = f"the agent's prompts summed to more than {self.max_prompt_tokens} tokens (max_prompt_tokens)."
        if self.over_cap is not None:
            raise SessionRefusal(429, f"this session is over its cap: {self.over_cap}", "session_cap")
        if self.budget is not None and self.budget.used >= self.budget.limit:
            raise SessionRefusal(429, f"this server's sessions hold {self.budget.limit / 2**30:.1f} GiB of records, "
                                 "the most it keeps; close finished sessions.", "server_sessions_full")
        ticket = Reservation(self.calls_started, room if max_tokens is None else min(max_tokens, room), prompt_bound)
        self.calls_started += 1
        self.reserved_sampled += ticket.sampled
        self.reserved_prompt += ticket.prompt
        return ticket

    def release(self, ticket: Reservation) -> None:
        """The call ended (answered or not): its reservation is given back."""
        self.reserved_sampled -= ticket.sampled
        self.reserved_prompt -= ticket.prompt

    def charge(self, nbytes: int) -> None:
        """``nbytes`` more held by this session, against the server's budget."""
        self.held_bytes += nbytes
        if self.budget is not None:
            self.budget.used += nbytes

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
        self.charge(recorded_bytes(response, prompt, sampled))


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


NOT_SESSION_SETTINGS = ("messages", "model", "stream", "stream_options")
MIN_SESSION_TIMEOUT_S = 1.0  # a session's timeout bounds every call it answers: below this, every call is a 504
SETTINGS_BYTES_PER_JSON_BYTE = 4  # parsed objects over their JSON text (strings ~1, small lists and dicts more)
MESSAGE_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name", "reasoning_content")  # what renders


def session_sampling(sampling: Any) -> dict[str, Any]:
    """A session's sampling arguments (``POST /v1/sessions``'s ``sampling``), checked when it opens by the
    rules every call's are checked by, so a session that opened never fails its calls for its settings:
    the ``create`` keyword arguments to force on every call (documented no-ops dropped). ``SessionRefusal``
    (400) names what is wrong: a key that is not a sampling argument, an unknown key, a bad value."""
    from openai import BadRequestError
    from openai.resources.chat.completions import AsyncCompletions

    from bridges.client.arguments import NO_OPS, integral, parse_chat

    if not isinstance(sampling, dict):
        raise SessionRefusal(400, "'sampling' must be an object of sampling arguments.", "invalid_session")
    for key in NOT_SESSION_SETTINGS:
        if key in sampling:
            raise SessionRefusal(400, f"'sampling.{key}' is not a sampling argument: a session's calls choose it.",
                                 "invalid_session")
    if sampling.get("n") is not None and integral(sampling["n"]) != 1:
        raise SessionRefusal(400, "'sampling.n' must be 1: a rollout samples one reply per call.", "invalid_session")
    timeout = sampling.get("timeout")
    if timeout is not None and (integral(timeout) is None and not isinstance(timeout, float)
                                or isinstance(timeout, bool) or not timeout >= MIN_SESSION_TIMEOUT_S):
        raise SessionRefusal(400, f"'sampling.timeout' must be at least {MIN_SESSION_TIMEOUT_S:.0f} second: it bounds "
                             "every call of the session.", "invalid_session")
    checked = split_kwargs({k: v for k, v in sampling.items() if k not in ("n", "timeout")}, AsyncCompletions.create)
    if timeout is not None:  # the SDK's own keyword (split_kwargs sends a body's "timeout" as an extra key)
        checked["timeout"] = float(timeout)
    forced = {k: v for k, v in checked.items() if k not in NO_OPS}  # no-ops are checked, then not kept
    try:
        parse_chat({"messages": [{"role": "user", "content": "x"}], "model": "session", **checked})
    except BadRequestError as exc:
        raise SessionRefusal(400, f"'sampling': {error_body(exc)[1]['error'].get('message')}", "invalid_session") from None
    except TypeError as exc:
        raise SessionRefusal(400, f"'sampling': {' '.join(str(exc).split())}", "invalid_session") from None
    return forced


def settings_bytes(forced: dict[str, Any]) -> int:
    """What a session's forced sampling arguments hold in memory, estimated from their JSON size."""
    import json

    return SETTINGS_BYTES_PER_JSON_BYTE * len(json.dumps(forced, default=str))


def rendered_messages(messages: list[Any]) -> list[Any]:
    """Each message with only the keys a chat template renders (``MESSAGE_KEYS``): an unrendered key
    (``"junk": <8 MiB>``) would otherwise be kept in the session's record, uncounted."""
    return [{k: m[k] for k in MESSAGE_KEYS if k in m} if isinstance(m, dict) else m for m in messages]


def chat_arguments(session: Session, body: dict[str, Any], call: int = 0) -> dict[str, Any]:
    """The ``create`` arguments for an agent's Chat Completions body (call number ``call`` of the session):
    the agent's, under the rollout's sampling arguments and model; never streamed (a stream is re-cut from
    the recorded response)."""
    from openai.resources.chat.completions import AsyncCompletions

    problem = tool_calls_problem(body)
    if problem is not None:
        raise SessionRefusal(400, problem[1], "invalid_tool_calls")
    if body.get("n", 1) not in (1, None):  # the record keeps one reply per call; more would be sampled unseen
        raise SessionRefusal(400, "'n' must be 1 on a session: a rollout samples one reply per call.", "invalid_n")
    _check_streaming(body)
    body = {k: v for k, v in body.items() if k not in ("stream", "stream_options", "model")}
    kwargs = split_kwargs(body, AsyncCompletions.create)
    kwargs["messages"] = rendered_messages(kwargs["messages"])
    _check_overridden(kwargs, session.forced)
    for key, value in session.forced.items():
        if key == "seed" and isinstance(value, int) and not isinstance(value, bool):
            kwargs["seed"] = value + SEED_STRIDE * call
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
    ticket = None
    try:
        asked = _max_tokens(session.forced, body)
        ticket = session.admit(asked, prompt_bound(body["messages"], body.get("tools")))
        kwargs = chat_arguments(session, body, ticket.call)
        if asked is None or ticket.sampled < asked:  # what the sampled cap leaves (checked like any max_tokens)
            kwargs["max_tokens"] = ticket.sampled
            kwargs.pop("max_completion_tokens", None)
        response = await session.client.chat.completions.create(**kwargs)
        session.record(kwargs["messages"], response)
    except SessionRefusal as refusal:
        return refusal.status, refusal.body(), None
    except TypeError as exc:  # an argument the SDK's create does not take, as the SDK says it
        return 400, SessionRefusal(400, " ".join(str(exc).split()), "invalid_argument").body(), None
    except Exception as exc:  # the engine's refusal (400 prompt too long, 504 timeout...), as serve sends it
        return (*error_body(exc), None)
    finally:
        if ticket is not None:
            session.release(ticket)
    return 200, None, response


def _check_overridden(kwargs: dict[str, Any], forced: dict[str, Any]) -> None:
    """The agent's own values of the arguments the rollout overrides, checked by a call's rules all the
    same: a malformed request is refused whether or not its value would have been used."""
    from openai import BadRequestError

    from bridges.client.arguments import parse_chat

    overridden = {k: v for k, v in kwargs.items() if k in forced and k not in ("messages", "model")}
    if "extra_body" in kwargs:  # the session may set keys of it (declared_tools_only) over the agent's
        overridden["extra_body"] = kwargs["extra_body"]
    if not overridden:
        return
    try:
        parse_chat({"messages": [{"role": "user", "content": "x"}], "model": "session", **overridden})
    except BadRequestError as exc:
        raise SessionRefusal(400, str(error_body(exc)[1]["error"].get("message")), "invalid_request") from None


def _check_streaming(body: dict[str, Any]) -> None:
    """``stream`` and ``stream_options`` by the rules of any chat call, though a session re-cuts the stream
    itself from the recorded reply (so the engine never sees them)."""
    stream, options = body.get("stream"), body.get("stream_options")
    if stream is not None and not isinstance(stream, bool):
        raise SessionRefusal(400, "'stream' must be a boolean.", "invalid_stream")
    if options is None:
        return
    if not stream:
        raise SessionRefusal(400, "'stream_options' is only allowed when 'stream' is true.", "invalid_stream")
    if not isinstance(options, dict) or any(
            key not in ("include_usage", "include_obfuscation") or not isinstance(value, bool)
            for key, value in options.items()):
        raise SessionRefusal(400, "'stream_options' holds only include_usage (a boolean).", "invalid_stream")


def _max_tokens(forced: dict[str, Any], body: dict[str, Any]) -> int | None:
    """The tokens a call asks to sample at most: the rollout's ``max_tokens`` (it wins), else the agent's;
    None when neither says (a malformed value is left for the call's own check to refuse)."""
    from bridges.client.arguments import integral

    for source in (forced, body):
        for key in ("max_tokens", "max_completion_tokens"):
            value = integral(source.get(key))
            if value is not None and value > 0:
                return value
    return None
