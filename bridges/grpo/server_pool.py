"""The inference servers a trainer samples from and pushes weights to (``trainer.inference=server``).

Each server is a ``bridges.serve`` the trainer reaches over HTTP: rollouts call its OpenAI routes, the
main training process pushes every step's weights (``weight_push.py``) through a channel
(``push_channels.py``: HTTP bodies, or broadcasts over NCCL/gloo).

Invariant: a server is *in* (rollouts may use it) only while it holds the trainer's current weight
version of this trainer's run (``run``: a fresh id per trainer process, so a server still holding an
earlier process's weights, even numbered higher, is pushed to rather than trusted); it is *out* from the moment a call or a push to it fails. Why: ``num_batches_ahead`` bounds
how stale a sample may be, and a server that missed a push would sample from weights older than
that bound. An out server is probed before each batch; when ``/health`` answers with the same model
layout and vocabulary, the main process brings it up to date (the whole model, then the adapter)
and it is in again. The other processes admit it once ``/health`` shows the current version.

At start every server must answer and match, or the run stops with one sentence naming it.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from typing import Any

import httpx2
import openai
import torch

from bridges.grpo.push_channels import PushRefused
from bridges.grpo.weight_push import full_payload, payloads
from bridges.models.weight_payload import Payload
from bridges.runtime.errors import ConfigError

PROBE_TIMEOUT_S = 5.0
API_KEY_VARIABLE, WEIGHTS_KEY_VARIABLE = "BRIDGES_SERVER_API_KEY", "BRIDGES_SERVER_WEIGHTS_KEY"


@dataclass(eq=False)
class Server:
    url: str  # http://host:port
    client: openai.AsyncOpenAI
    model: str = ""  # the name it serves, from /health
    version: int = -1  # the weight version it holds, as last seen
    run: str = ""  # the trainer run that version belongs to
    up: bool = False
    was_in: bool = False  # so that coming back is said, and the first admission is not
    reason: str = "not checked yet"  # why it is out
    channels: list[str] = field(default_factory=list)  # how it takes weights, from /health


@dataclass(frozen=True)
class Identity:
    """What a server must match: the trainer's tensor layout and vocabulary (``weight_payload``)."""

    layout: str
    tokenizer: str


@dataclass(eq=False)
class ServerPool:
    servers: list[Server]
    identity: Identity
    pusher: bool  # the main process pushes; the others only watch versions
    api_key: str | None = None
    weights_key: str | None = None
    scalings: dict[str, float] = field(default_factory=dict)  # LoRA layers; empty for full fine-tuning
    version: int = 0  # the trainer's current weight version (its step: a resumed run goes on from it)
    run: str = ""  # this trainer's run id: pushes are numbered by (run, version)
    channel: Any = None  # push_channels.open_channel's, on the main process: the only one that sends
    _base: dict[str, torch.Tensor] = field(default_factory=dict)  # LoRA: the frozen base, on the CPU
    _latest: list[Payload] = field(default_factory=list)  # the current version's push, as sent

    @classmethod
    def connect(
        cls, urls: list[str], identity: Identity, pusher: bool, timeout: float, **keys: Any
    ) -> ServerPool:
        api_key = keys.get("api_key") or os.environ.get(API_KEY_VARIABLE)
        servers = [Server(url.rstrip("/"), openai.AsyncOpenAI(base_url=f"{url.rstrip('/')}/v1",
                   api_key=api_key or "unused", max_retries=0, timeout=timeout)) for url in urls]
        return cls(
            servers,
            identity,
            pusher,
            api_key,
            keys.get("weights_key") or os.environ.get(WEIGHTS_KEY_VARIABLE),
        )

    def in_servers(self) -> list[Server]:
        return [s for s in self.servers if s.up]

    def reasons(self) -> str:
        """Why each server is where it is, for a sentence that says none can serve."""
        return "; ".join(f"{s.url}: {s.reason}" for s in self.servers)

    async def check_all(self) -> None:
        """At start: every server answers ``/health`` with the trainer's layout and vocabulary, or one
        sentence naming the first that does not."""
        for server in self.servers:
            problem = await self.probe(server)
            if problem is not None:
                raise ConfigError(f"inference server {server.url}: {problem}")

    async def probe(self, server: Server) -> str | None:
        """None when ``server`` answers and matches (its model and version noted), else why not."""
        try:
            async with httpx2.AsyncClient(timeout=PROBE_TIMEOUT_S) as http:
                health = (await http.get(f"{server.url}/health")).json()
        except (httpx2.HTTPError, ValueError) as exc:
            return f"no answer on /health ({type(exc).__name__}); is it running?"
        if not isinstance(health, dict) or "layout" not in health:
            return "its /health does not describe its model; start it with python -m bridges.serve."
        if health.get("layout") != self.identity.layout:
            return ("it serves another model: its tensor names or shapes differ from the trainer's "
                    f"(model={health.get('model')!r}); start it with the trainer's model.")
        if health.get("tokenizer") != self.identity.tokenizer:
            return "its tokenizer differs from the trainer's, so token ids would not mean the same; start it with the trainer's model."
        server.model, server.version = str(health.get("model", "")), int(health.get("weight_version", -1))
        server.run = str(health.get("weight_run", ""))
        server.channels = [str(c) for c in health.get("weight_channels", ["http"])]
        return None

    def mark_out(self, server: Server, reason: str) -> None:
        if server.up:
            print(f"inference server {server.url} is out: {reason}", flush=True)
        server.up, server.reason = False, reason

    async def refresh(self) -> None:
        """Probe every out server; bring back those that answer and match (see the module's invariant)."""
        await asyncio.gather(*(self._readmit(s) for s in self.servers if not s.up))

    async def _readmit(self, server: Server) -> None:
        problem = await self.probe(server)
        if problem is not None:
            server.reason = problem
            return
        if not self._holds_current(server) and self.pusher and self._latest:
            await self._send(server, await asyncio.to_thread(self._whole_parts))
        if self._holds_current(server):
            if server.was_in:
                print(
                    f"inference server {server.url} is back in at weight version {server.version}", flush=True
                )
            self._admit(server)

    def _holds_current(self, server: Server) -> bool:
        """Exactly this run's current version: another run's weights, or ones ahead of the trainer, are
        not trusted (pushed to on the main process, waited for on the others)."""
        return server.run == self.run and server.version == self.version

    def _admit(self, server: Server) -> None:
        server.up = server.was_in = True

    async def push(self, state: dict[str, torch.Tensor], version: int, whole: bool) -> None:
        """The main process: ``version``'s tensors to every server that is in; a failed push takes that
        server out. ``whole``: the first push, which carries the whole model."""
        self.version = version
        if whole and self.scalings:
            self._base = {
                k: v.detach().to("cpu", copy=True) for k, v in full_payload(state, version, self.run).tensors.items()
            }
        parts = payloads(state, self.scalings, version, whole, self.run)
        self._latest = parts[-1:] if self.scalings else parts
        await asyncio.gather(*(self._send(s, parts) for s in self.servers if s.up or whole))
        refused = [s for s in self.servers if not s.up]
        if whole and refused:  # at start: a server that will not take the weights is a setup mistake
            raise ConfigError(
                f"inference server {refused[0].url} did not take the trainer's weights: {refused[0].reason}"
            )

    async def follow(self, version: int) -> None:
        """The other processes, once the main one pushed ``version``: in are the servers that hold it."""
        self.version = version
        caught_up = await asyncio.gather(*(self._caught_up(s) for s in self.servers))
        for server, ok in zip(self.servers, caught_up, strict=True):
            if ok:
                self._admit(server)
            else:
                server.up = False

    async def _caught_up(self, server: Server) -> bool:
        return await self.probe(server) is None and server.run == self.run and server.version >= self.version

    def _whole_parts(self) -> list[Payload]:
        """What brings a fresh server to the current version: the latest push, after the base for LoRA."""
        if not self.scalings:
            return list(self._latest)
        return [full_payload(self._base, self.version, self.run), *self._latest]

    async def _send(self, server: Server, parts: list[Payload]) -> None:
        try:
            await self.channel.send(server.url, parts)
            server.version, server.run = self.version, self.run
            self._admit(server)
        except (httpx2.HTTPError, PushRefused) as exc:
            self.mark_out(server, f"the weight push failed ({' '.join(str(exc).split())[:200]})")

