"""How a weight push reaches one server: in HTTP bodies, or over a collective pair.

Both channels take the same payloads (``weight_push``) to the same route (``POST /v1/weights``) and
fail the same way (``PushRefused`` or a transport error, after which the pool takes the server out):
the pool cannot tell them apart. ``http`` encodes each payload as one safetensors body. ``gloo`` and
``nccl`` send a manifest in the body and broadcast the tensors over a process group of two that the
trainer opens with each server (``bridges.models.weight_channel``): device to device with NCCL, the
way vLLM's weight sync moves weights; gloo runs the same code on the CPU.

``trainer.weight_channel=auto`` is nccl where the trainer computes on CUDA and every server offers
nccl on its ``/health``, else http.
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import socket
from typing import Any
from urllib.parse import urlsplit

import httpx2
import torch

from bridges.models.hardware import bound
from bridges.models.weight_channel import Manifest, Pair
from bridges.models.weight_payload import Payload, encode
from bridges.runtime.errors import ConfigError

PUSH_TIMEOUT_S = 600.0
PAIR_TIMEOUT_S = 60.0  # a pair's rendezvous and each of its broadcasts
CHANNELS = ("auto", "http", "gloo", "nccl")


class PushRefused(Exception):
    pass


class HttpChannel:
    """Each payload as one safetensors body, encoded once for every server it goes to."""

    name = "http"
    KEPT = 4  # encoded bodies kept: a LoRA catch-up sends two payloads, a step's push one or two

    def __init__(self, headers: dict[str, str]) -> None:
        self.headers = headers
        self._bodies: dict[int, tuple[Payload, asyncio.Future[bytes]]] = {}

    async def send(self, url: str, payloads: list[Payload]) -> None:
        async with httpx2.AsyncClient(timeout=PUSH_TIMEOUT_S) as http:
            for payload in payloads:
                body = await self._body(payload)
                _check(await http.post(f"{url}/v1/weights", content=body, headers=self.headers))

    async def _body(self, payload: Payload) -> bytes:
        kept = self._bodies.get(id(payload))
        if kept is None or kept[0] is not payload:  # the pool's concurrent sends share one encoding
            kept = (payload, asyncio.ensure_future(asyncio.to_thread(encode, payload)))
            self._bodies[id(payload)] = kept
            while len(self._bodies) > self.KEPT:
                self._bodies.pop(next(iter(self._bodies)))
        return await asyncio.shield(kept[1])

    def close(self) -> None:
        self._bodies.clear()


class CollectiveChannel:
    """A pair per server, opened on its first push and dropped when a push to it fails (a server that
    comes back joins a new pair under a new prefix of the one store)."""

    def __init__(self, backend: str, headers: dict[str, str], device: Any = None) -> None:
        import torch.distributed as dist

        self.name, self.headers, self.device = backend, headers, device  # device: the policy's (nccl)
        timeout = datetime.timedelta(seconds=PAIR_TIMEOUT_S)
        self.store = dist.TCPStore("0.0.0.0", 0, is_master=True, wait_for_workers=False, timeout=timeout)
        self.pairs: dict[str, Pair] = {}
        self._prefixes, self._pushes = itertools.count(), itertools.count()

    async def send(self, url: str, payloads: list[Payload]) -> None:
        try:
            async with httpx2.AsyncClient(timeout=PUSH_TIMEOUT_S) as http:
                pair = self.pairs.get(url) or await self._join(http, url)
                for payload in payloads:
                    await self._push(http, url, pair, payload)
        except BaseException as exc:
            self.pairs.pop(url, None)
            if isinstance(exc, RuntimeError | OSError | ValueError):  # gloo's and NCCL's own errors
                raise PushRefused(f"the {self.name} channel failed: {exc}") from None
            raise

    async def _join(self, http: httpx2.AsyncClient, url: str) -> Pair:
        """The server validates the join and answers at once, then completes the group from its side."""
        prefix = f"pair/{next(self._prefixes)}/"
        body = {"host": _address_towards(url), "port": self.store.port, "prefix": prefix,
                "backend": self.name, "timeout_s": PAIR_TIMEOUT_S}
        _check(await http.post(f"{url}/v1/weights/channel", json=body, headers=self.headers))
        pair = await asyncio.to_thread(bound(self.device, Pair), self.store, prefix, 0, self.name, PAIR_TIMEOUT_S,
                                       self.device)
        self.pairs[url] = pair
        return pair

    async def _push(self, http: httpx2.AsyncClient, url: str, pair: Pair, payload: Payload) -> None:
        """The manifest in the body; the tensors once the server marks the push ready (a server that
        refuses answers without marking it, and nothing is broadcast)."""
        manifest = Manifest.of(payload, next(self._pushes))
        reply = asyncio.ensure_future(
            http.post(f"{url}/v1/weights", json=manifest.to_json(), headers=self.headers)
        )
        try:
            while not reply.done() and not pair.is_ready(manifest.push):
                await asyncio.sleep(0.005)
            if pair.is_ready(manifest.push):
                await asyncio.to_thread(bound(self.device, pair.send), list(payload.tensors.values()))
            _check(await reply)
        finally:
            reply.cancel()

    def close(self) -> None:
        self.pairs.clear()


def open_channel(choice: str, offered: list[list[str]], device: Any, weights_key: str | None) -> Any:
    """The channel ``trainer.weight_channel`` names, given what each server offers and the policy's
    ``device``, or one sentence."""
    on_cuda = torch.device(device).type == "cuda"
    headers = {"Authorization": f"Bearer {weights_key}"} if weights_key else {}
    everywhere = set.intersection(*(set(channels) for channels in offered)) if offered else set()
    name = ("nccl" if on_cuda and "nccl" in everywhere else "http") if choice == "auto" else choice
    if name not in everywhere:
        raise ConfigError(
            f"trainer.weight_channel={name}: not every inference server offers it (they offer "
            f"{sorted(everywhere) or 'no common channel'}); use trainer.weight_channel=http."
        )
    if name == "nccl" and not on_cuda:
        raise ConfigError("trainer.weight_channel=nccl needs the trainer on CUDA (trainer.device).")
    return HttpChannel(headers) if name == "http" else CollectiveChannel(name, headers, torch.device(device))


def _address_towards(url: str) -> str:
    """This machine's address on the route to the server (no packet is sent: a UDP connect only
    chooses the interface), so a server on another host can reach the trainer's store."""
    host = urlsplit(url).hostname or "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((host, 9))
            return str(probe.getsockname()[0])
        except OSError:
            return "127.0.0.1"


def _check(reply: Any) -> None:
    if reply.status_code != 200:
        raise PushRefused(_message(reply))


def _message(reply: Any) -> str:
    try:
        return f"{reply.status_code}: {reply.json()['error']['message']}"
    except (ValueError, KeyError, TypeError):
        return f"{reply.status_code}: {reply.text[:200]}"
