"""The model endpoint a verifiers v1 rollout calls: our engine, answering on loopback, one ledger per session.

verifiers v1 answers every model call of a rollout inside its interception server, which hands the
request to a client chosen only by config type. Of the two honest ways in — serve the vLLM-style
``/inference/v1/generate`` token route for its ``TrainClient`` (which renders prompts itself with the
``renderers`` package), or answer Chat Completions on our own OpenAI-compatible surface for its
``EvalClient`` — this takes the second: the ``EvalClient`` forwards the request unchanged with the
rollout's trace id as ``X-Session-ID``, ``EngineClient`` samples it with its token ledger, and the
response (token ids, logprobs) is kept under that session. The rollout then reads exactly the ids the
engine sampled, whatever text verifiers' hooks later served to the agent. A per-rollout session keyed
by a header is also the seam agents in other programs use.

The endpoint runs in the rollout's own event loop (aiohttp, a verifiers dependency), binds 127.0.0.1
only, and requires a bearer secret it makes itself.
"""

from __future__ import annotations

import json
import secrets
from collections import defaultdict
from typing import Any

from bridges.client.api_errors import error_body
from bridges.client.http_bodies import response_json, split_kwargs

SESSION_HEADER = "X-Session-ID"  # verifiers.v1.clients.client.SESSION_ID_HEADER
MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_CALLS_PER_SESSION = 256


class SessionEndpoint:
    """``/c/<client>/v1/chat/completions`` over each client added (``url_for``); every answered call is
    kept under its session id. One endpoint serves every client of its event loop: verifiers' env holds
    one interception server at a time, so the clients a backend swaps in (Tinker's sampler per weight
    version) must share it rather than each open their own beside it."""

    def __init__(self) -> None:
        self.secret = secrets.token_urlsafe(24)
        self.calls: dict[str, list[Any]] = defaultdict(list)
        self.clients: dict[int, Any] = {}
        self._runner: Any = None
        self._root = ""

    def url_for(self, client: Any) -> str:
        """The base URL under which ``client`` answers (added on first use, kept until the endpoint closes)."""
        self.clients[id(client)] = client
        return f"{self._root}/c/{id(client)}/v1"

    def take(self, session_id: str) -> list[Any]:
        """The responses recorded for ``session_id``, in order (forgotten here once taken)."""
        return self.calls.pop(session_id, [])

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
        self.calls.clear()  # a rollout cut short by its deadline never took its calls
        self.clients.clear()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _chat(self, request: Any) -> Any:
        from aiohttp import web
        from openai.resources.chat.completions import AsyncCompletions

        if request.headers.get("Authorization") != f"Bearer {self.secret}":
            return _error(web, 401, "the bearer secret is missing or wrong.")
        client = self.clients.get(
            int(request.match_info["client"]) if request.match_info["client"].isdigit() else -1
        )
        if client is None:
            return _error(web, 404, "no client is served under that path.")
        session = request.headers.get(SESSION_HEADER, "")
        if len(self.calls.get(session, ())) >= MAX_CALLS_PER_SESSION:
            return _error(web, 429, f"session has made {MAX_CALLS_PER_SESSION} calls, its cap.")
        try:
            body = json.loads(await request.read())
        except (ValueError, UnicodeDecodeError):
            return _error(web, 400, "the body is not JSON.")
        if not isinstance(body, dict) or "messages" not in body:
            return _error(web, 400, "the body must be a JSON object with messages.")
        body.pop("stream", None)  # the seat asks without streaming; verifiers frames any stream itself
        body.pop("stream_options", None)
        try:
            response = await client.chat.completions.create(**split_kwargs(body, AsyncCompletions.create))
        except TypeError as exc:  # an argument the SDK's create does not take, as the SDK says it
            return _error(web, 400, " ".join(str(exc).split()))
        except Exception as exc:  # the engine's refusal, in OpenAI's error shape
            status, payload = error_body(exc)
            return web.json_response(payload, status=status)
        self.calls[session].append(response)
        return web.json_response(response_json(response))


def _error(web: Any, status: int, message: str) -> Any:
    return web.json_response({"error": {"message": message, "type": "invalid_request_error"}}, status=status)
