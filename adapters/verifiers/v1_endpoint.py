"""The model endpoint a verifiers v1 rollout calls: our engine, one ledger per session.

verifiers v1 answers every model call of a rollout inside its interception server, which hands the
request to a client chosen only by config type. Of the two honest ways in — serve the vLLM-style
``/inference/v1/generate`` token route for its ``TrainClient`` (which renders prompts itself with the
``renderers`` package), or answer Chat Completions on our own OpenAI-compatible surface for its
``EvalClient`` — this takes the second: the ``EvalClient`` forwards the request unchanged with the
rollout's trace id as ``X-Session-ID``, ``EngineClient`` samples it with its token ledger, and the
response (token ids, logprobs) is kept under that session. The rollout then reads exactly the ids the
engine sampled, whatever text verifiers' hooks later served to the agent. A per-rollout session keyed
by a header is also the seam agents in other programs use. Where verifiers runs one interception
server (our default), its upstream hop reaches ``answer`` in-process (``v1_relay``); the HTTP route
serves its pools of servers.

The endpoint runs in the rollout's own event loop (aiohttp), binds 127.0.0.1
only, and requires a bearer secret it makes itself (compared in constant time). Sessions live under
their episode: a call must name one (``X-Session-ID``, at most ``MAX_SESSION_ID`` characters), an
episode opens at most ``MAX_SESSIONS_PER_EPISODE``, and ending an episode frees every session it
opened, whether its rollout finished or failed.

Seeds: verifiers sends every call of an episode with the episode's one sampling config, so every
agent run in it (both seats of a hand, the ``n`` attempts of ``best-of-n`` at one identical prompt)
would sample with one seed and, at an identical prompt, sample identical replies. Each episode is
therefore named in every call, and its j-th session samples with ``seed + j * EPISODE_SEED_STRIDE``,
and that session's call k with ``SEED_STRIDE`` more per call, as every session.

Why the episode rides in the body (``EPISODE_KEY``, a sampling key verifiers passes through, taken out
here before sampling) and not in the URL: verifiers' interception server keeps one model client per
distinct endpoint config, and building one (an ``httpx`` client with a fresh TLS context) costs ~17 ms
of CPU. A URL per episode paid that on every rollout, more than the rollout's own work; one URL per
engine client pays it once and shares verifiers' keepalive pool, as verifiers intends.
"""

from __future__ import annotations

import hmac
import secrets
from typing import Any

from bridges.agents.session_routes import chat_reply, parse_body
from bridges.agents.sessions import SEED_STRIDE, Session, SessionRefusal, answer_chat

SESSION_HEADER = "X-Session-ID"  # verifiers.v1.clients.client.SESSION_ID_HEADER
MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_CALLS_PER_SESSION = 256
MAX_SESSIONS_PER_EPISODE = 256
MAX_SESSION_ID = 200
EPISODE_SEED_STRIDE = MAX_CALLS_PER_SESSION * SEED_STRIDE  # past every call of the session before
EPISODE_KEY = "bridges_episode"  # the sampling key that names a call's episode (module doc)


class SessionEndpoint:
    """``/c/<client>/v1/chat/completions`` over each client added (``url_for``), each call naming its
    episode (``EPISODE_KEY``, from ``open_episode``); every
    answered call is kept under its session id. One endpoint serves every client of its event loop:
    verifiers' env holds one interception server at a time, so the clients a backend swaps in (Tinker's
    sampler per weight version) must share it rather than each open their own beside it. Each call is
    answered by the same session core as agents in other programs (``bridges.agents.sessions.answer_chat``:
    tool calls checked, capped, recorded); verifiers names the session in a header rather than in the URL."""

    def __init__(self) -> None:
        self.secret = secrets.token_urlsafe(24)
        self.sessions: dict[str, dict[str, Session]] = {}  # episode -> its sessions by X-Session-ID
        self.clients: dict[int, Any] = {}
        self.episodes: dict[str, int] = {}  # episode -> sessions it has opened (the next one's seed offset)
        self._runner: Any = None
        self._root = ""

    def url_for(self, client: Any) -> str:
        """The base URL under which ``client`` answers (kept until the endpoint closes)."""
        self.clients[id(client)] = client
        return f"{self._root}/c/{id(client)}/v1"

    def open_episode(self, episode: str) -> dict[str, str]:
        """Serve ``episode`` until ``end_episode``: the sampling arguments its calls must carry."""
        self.episodes.setdefault(episode, 0)
        return {EPISODE_KEY: episode}

    def end_episode(self, episode: str) -> None:
        """The episode is over (done or failed): its path stops answering and its sessions are freed."""
        self.episodes.pop(episode, None)
        self.sessions.pop(episode, None)

    def take(self, episode: str, session_id: str) -> list[Any]:
        """The responses recorded for ``session_id`` of ``episode``, in order (forgotten here once taken)."""
        session = self.sessions.get(episode, {}).pop(session_id, None)
        return session.responses if session is not None else []

    async def __aenter__(self) -> SessionEndpoint:
        from aiohttp import web

        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post("/c/{client}/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self._root = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.sessions.clear()  # a rollout cut short by its deadline never took its calls
        self.clients.clear()
        self.episodes.clear()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _chat(self, request: Any) -> Any:
        from aiohttp import web

        given = request.headers.get("Authorization", "").encode()
        if not hmac.compare_digest(given, f"Bearer {self.secret}".encode()):
            return _error(web, 401, "the bearer secret is missing or wrong.")
        client = self.clients.get(
            int(request.match_info["client"]) if request.match_info["client"].isdigit() else -1
        )
        if client is None:
            return _error(web, 404, "no client is served under that path.")
        try:
            body = parse_body(await request.read())
        except web.HTTPRequestEntityTooLarge:
            return _error(web, 413, f"the request body is larger than {MAX_BODY_BYTES} bytes.")
        except SessionRefusal as refusal:
            return _error(web, refusal.status, refusal.message)
        status, error, response = await self.answer(client, body, request.headers.get(SESSION_HEADER, ""))
        if error is not None:
            return web.json_response(error, status=status)
        reply = chat_reply(response, body)  # a program harness's client streams (verifiers 0.4's)
        return web.Response(body=reply.body, content_type=reply.content_type)

    async def answer(self, client: Any, body: dict[str, Any], session_id: str) -> tuple[int, dict[str, Any] | None, Any]:
        """One Chat Completions call of ``client``'s, named by its body's episode and ``session_id``,
        whichever transport carried it (this endpoint's HTTP route, or ``v1_relay`` in-process): (HTTP
        status, error JSON or None, the response). Takes ``EPISODE_KEY`` out of ``body``."""
        episode = body.pop(EPISODE_KEY, None)
        if not isinstance(episode, str) or episode not in self.episodes:
            message = f"the call names no episode being served ('{EPISODE_KEY}'; an ended one's)."
            return 404, SessionRefusal(404, message, "unknown_episode").body(), None
        try:
            session = self._session(episode, session_id, client, body)
        except SessionRefusal as refusal:
            return refusal.status, refusal.body(), None
        return await answer_chat(session, body)

    def _session(self, episode: str, key: str, client: Any, body: dict[str, Any]) -> Session:
        """The episode's session named ``key``, opened on its first call (verifiers sends each call with
        the seat's own model name and sampling), or the refusal."""
        if not 0 < len(key) <= MAX_SESSION_ID:
            raise SessionRefusal(400, f"a call names its session in {SESSION_HEADER} (1-{MAX_SESSION_ID} characters).",
                                 "invalid_session")
        sessions = self.sessions.setdefault(episode, {})
        session = sessions.get(key)
        if session is None:
            if len(sessions) >= MAX_SESSIONS_PER_EPISODE:
                raise SessionRefusal(429, f"this episode opened {MAX_SESSIONS_PER_EPISODE} sessions, the most it may.",
                                     "too_many_sessions")
            forced = self._session_seed(episode, body.get("seed"))
            session = Session(key, client, str(body.get("model", "")), forced, max_calls=MAX_CALLS_PER_SESSION,
                              declared_tools_only=False)  # verifiers' programs answer an unknown tool as vLLM serves it
            sessions[key] = session
        return session

    def _session_seed(self, episode: str, seed: Any) -> dict[str, Any]:
        """The seed a new session of ``episode`` samples with: the episode's, moved past its earlier
        sessions' (none where the call carries none)."""
        if not isinstance(seed, int) or isinstance(seed, bool):
            return {}
        opened, self.episodes[episode] = self.episodes[episode], self.episodes[episode] + 1
        return {"seed": seed + opened * EPISODE_SEED_STRIDE}


def _error(web: Any, status: int, message: str) -> Any:
    return web.json_response({"error": {"message": message, "type": "invalid_request_error"}}, status=status)
