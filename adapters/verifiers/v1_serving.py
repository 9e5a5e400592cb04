"""verifiers' serving resources for the rollouts of one event loop, and our endpoint beside them.

verifiers multiplexes concurrent rollouts over one interception server, which its env holds one of
at a time; opening it and our endpoint costs ~80 ms (two TLS contexts, two loopback servers). They
are opened by the first rollout of a loop and kept while any runs, and for ``LINGER_S`` after the
last ends, so a backend that plays its rollouts in waves (or one at a time) opens them once, not per
wave: opened per rollout, they cost 50 ms of a rollout that otherwise costs a few. An idle serving
closes itself after the linger, or when its loop shuts down (``asyncio.run`` cancels the waiting
closer, which then closes everything before the loop ends).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
from typing import Any

from bridges.adapters.verifiers.v1_endpoint import SessionEndpoint
from bridges.adapters.verifiers.v1_sharing import SharedEpisodes

LINGER_S = 5.0  # seconds an idle serving stays open for the next rollout of its loop


class Serving:
    """verifiers' serving resources (interception server, shared tools) and our endpoint for one event
    loop (module doc). Every client of the loop is answered on the one endpoint, under a path of its own."""

    def __init__(self, vf_env: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.vf_env, self.loop = vf_env, loop
        self.endpoint = SessionEndpoint()
        self.episodes: SharedEpisodes[tuple[Any, dict[str, Any]]] = SharedEpisodes()
        self.numbers = itertools.count()  # each episode's name on the endpoint (its sessions' seeds)
        self.key_var = f"BRIDGES_V1_ENDPOINT_{id(self):x}"  # verifiers' client reads its key from one
        self._users = 0
        self._lock = asyncio.Lock()
        self._stack: contextlib.AsyncExitStack | None = None
        self._closer: asyncio.Task[None] | None = None  # waits LINGER_S after the last user, then closes

    @property
    def is_open(self) -> bool:
        return self._stack is not None

    def context(self, client: Any, model: str, sampling: Any) -> Any:
        from verifiers.v1.clients import ModelContext
        from verifiers.v1.configs.client import EvalClientConfig

        from bridges.adapters.verifiers.v1_relay import install

        url = self.endpoint.url_for(client)
        config = EvalClientConfig(base_url=url, api_key_var=self.key_var)
        # the env's live interception (verifiers keeps it on the env while serving() is open, and
        # offers no other handle): its upstream hop answered in-process (v1_relay)
        install(self.vf_env._interception, config, self.endpoint, client)
        return ModelContext(model, config, sampling)

    async def __aenter__(self) -> Serving:
        async with self._lock:
            if self._closer is not None:  # used again within the linger: stays open
                closer, self._closer = self._closer, None
                closer.cancel()
            if self._stack is None:
                await self._open()
            self._users += 1
        return self

    async def __aexit__(self, *exc: object) -> None:
        async with self._lock:
            self._users -= 1
            if self._users == 0 and self._stack is not None:
                self._closer = self.loop.create_task(self._close_when_idle())

    async def _close_when_idle(self) -> None:
        try:
            await asyncio.sleep(LINGER_S)
        finally:  # the linger ran out, or the loop is shutting down and cancelled it: close unless reused
            async with self._lock:
                if self._closer is asyncio.current_task() and self._users == 0 and self._stack is not None:
                    stack, self._stack, self._closer = self._stack, None, None
                    await stack.aclose()

    async def _open(self) -> None:
        from bridges.adapters.verifiers.v1_seat import hold_http_client, release_http_client

        stack = contextlib.AsyncExitStack()
        try:
            await stack.enter_async_context(self.endpoint)
            os.environ[self.key_var] = self.endpoint.secret
            stack.callback(os.environ.pop, self.key_var, None)
            hold_http_client()
            stack.push_async_callback(release_http_client)
            await stack.enter_async_context(self.vf_env.serving())
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack
