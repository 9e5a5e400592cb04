"""Attacks on a server's weight routes (issue 40, items 2-4), over real HTTP and real gloo pairs.

Before: a channel join connected anywhere (a metadata address, an arbitrary listener), told a closed
port from an open one, ran on the executor sampling shares, ignored its timeout against a silent peer
and was awaited under the push lock; NaN/inf tensors, a NaN or 1e39 LoRA scaling and int/bool tensors
were taken with 200; a version of 10^18 pinned the server, "²" or 5,000 digits was a 500, and a
resumed trainer (numbering from 1) was refused while the pool trusted a server ahead of it."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from weight_server import fresh, weight_server

from bridges.grpo.push_channels import CollectiveChannel, HttpChannel, PushRefused
from bridges.grpo.weight_push import payloads
from bridges.models.weight_payload import Payload, encode
from bridges.server import weights as weight_routes
from bridges.server.app import WeightUpdates, serve_in_thread

KEY = "weights-secret"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture
def served(tiny_path: Path, tiny_tokenizer: Any) -> Iterator[tuple[Any, Any]]:
    with weight_server(tiny_path, tiny_tokenizer, KEY, identity=True) as served:
        yield served


def post(server: Any, path: str, body: Any = None, raw: bytes | None = None) -> httpx.Response:
    if raw is not None:
        return httpx.post(f"{server.url}/v1/weights{path}", content=raw, headers=AUTH, timeout=60)
    return httpx.post(f"{server.url}/v1/weights{path}", json=body, headers=AUTH, timeout=60)


def chat_seconds(server: Any) -> float:
    started = time.monotonic()
    reply = httpx.post(f"{server.url}/v1/chat/completions", timeout=60,
                       json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert reply.status_code == 200, reply.text
    return time.monotonic() - started


class SilentPeer:
    """A listener that accepts every connection and never answers (until closed)."""

    def __init__(self) -> None:
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(64)
        self.port = self.socket.getsockname()[1]
        self.held: list[socket.socket] = []
        self.lock, self.closed = threading.Lock(), False
        self.acceptor = threading.Thread(target=self._accept, daemon=True)
        self.acceptor.start()

    def _accept(self) -> None:
        while True:
            try:
                connection = self.socket.accept()[0]
            except OSError:
                return
            with self.lock:
                if self.closed:  # accepted while closing: not held
                    connection.close()
                    return
                self.held.append(connection)

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.socket.close()
            for held in self.held:
                held.close()
        self.acceptor.join(5)


JOIN = {"host": "127.0.0.1", "prefix": "p/", "backend": "gloo"}


def test_a_join_connects_only_to_the_address_it_came_from(tiny_path: Path, tiny_tokenizer: Any):
    from bridges.adapters.hf import HFEngine
    from bridges.client import EngineClient

    model = fresh(tiny_path)
    engine = HFEngine(model, tiny_tokenizer)
    with serve_in_thread(EngineClient(engine, model_name="tiny"), updates=WeightUpdates(KEY, model)) as server:
        refused = post(server, "/channel", {**JOIN, "host": "169.254.169.254", "port": 80, "timeout_s": 1})
        bad = [post(server, "/channel", {**JOIN, "port": 9, "timeout_s": t}).json() for t in ("nan", -1, 1e9)]
        no_port = post(server, "/channel", {**JOIN, "port": 0, "timeout_s": 1})
    assert refused.status_code == 403 and "joins only the address its request came from" in refused.text
    assert all("timeout_s must be above 0 and at most 600" in b["error"]["message"] for b in bad)
    assert no_port.status_code == 400 and "a port from 1 to 65535" in no_port.text
    allowed = WeightUpdates(KEY, model, channel_hosts=("169.254.169.254",))
    with serve_in_thread(EngineClient(engine, model_name="tiny"), updates=allowed) as server:
        assert post(server, "/channel", {**JOIN, "host": "169.254.169.254", "port": 80, "timeout_s": 1}).status_code == 200
    engine.close()


def test_a_silent_peer_costs_the_timeout_says_nothing_and_never_stalls_sampling(served: Any, tiny_path: Path):
    server, engine = served
    peer = SilentPeer()
    manifest = {"channel": {"push": 0}, "kind": "full", "version": 1, "tensors": [["model.norm.weight", "float32", [64]]]}
    try:
        for _ in range(3):  # joins replace each other; each one's thread hangs on the silent peer
            assert post(server, "/channel", {**JOIN, "port": peer.port, "timeout_s": 2}).status_code == 200
        assert chat_seconds(server) < 5  # sampling does not wait on the joins' threads
        started = time.monotonic()
        http_push = threading.Thread(target=lambda: post(server, "", raw=encode(Payload("full", 5, {}))))
        http_push.start()
        broken = post(server, "", manifest)  # awaits the join (not under the lock) until its timeout
        http_push.join(10)
        assert time.monotonic() - started < 10 and not http_push.is_alive()
        assert broken.status_code == 503 and broken.json()["error"]["message"] == weight_routes.CHANNEL_FAILED
        assert engine.weight_version == 5  # the HTTP push was not held behind the channel push
        for _ in range(weight_routes.MAX_HUNG_JOINS):
            post(server, "/channel", {**JOIN, "port": peer.port, "timeout_s": 1})
        deadline = time.monotonic() + 30
        while weight_routes.CHANNEL_THREADS.threads_abandoned < weight_routes.MAX_HUNG_JOINS:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        busy = post(server, "/channel", {**JOIN, "port": peer.port, "timeout_s": 1})
        assert busy.status_code == 503 and "hang past their timeout" in busy.text
    finally:
        peer.close()  # the hung threads see the connection end and return
    deadline = time.monotonic() + 30
    while weight_routes.CHANNEL_THREADS.threads_running:  # the store clients retry, then give up
        assert time.monotonic() < deadline, "the join threads did not return once the peer closed"
        time.sleep(0.2)


def test_a_closed_and_an_open_port_fail_alike(served: Any):
    server, _ = served
    manifest = {"channel": {"push": 0}, "kind": "full", "version": 1, "tensors": []}
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    texts = []
    with socket.socket() as talker:  # a listener that answers with bytes of its own
        talker.bind(("127.0.0.1", 0))
        talker.listen(4)

        def answer() -> None:
            with contextlib_suppress():
                connection, _ = talker.accept()
                connection.sendall(b"SSH-2.0-OpenSSH_9.6 secret banner\r\n" * 64)
                connection.close()

        threading.Thread(target=answer, daemon=True).start()
        for target in (port, talker.getsockname()[1]):
            assert post(server, "/channel", {**JOIN, "port": target, "timeout_s": 3}).status_code == 200
            texts.append(post(server, "", manifest).json()["error"]["message"])
    assert texts == [weight_routes.CHANNEL_FAILED] * 2


def contextlib_suppress() -> Any:
    import contextlib

    return contextlib.suppress(OSError)


def test_a_replaced_pair_is_closed():
    """A pair that formed and was then replaced by a new join is ended (its sockets with it)."""
    import datetime

    import torch.distributed as dist

    from bridges.models.weight_channel import Pair

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=30))
    joined: list[Pair] = []
    side = threading.Thread(target=lambda: joined.append(Pair.join("127.0.0.1", store.port, "x/", "gloo", 30)))
    side.start()
    Pair(store, "x/", 0, "gloo", 30)
    side.join(30)

    async def replace() -> None:
        formed: asyncio.Future[Pair] = asyncio.get_running_loop().create_future()
        formed.set_result(joined[0])
        weight_routes._close_pair(formed)
        failed: asyncio.Future[Pair] = asyncio.get_running_loop().create_future()
        failed.set_exception(RuntimeError("never formed"))
        weight_routes._close_pair(failed)  # nothing to close, and no error

    asyncio.run(replace())
    assert joined[0].group is None


NOT_OK = [
    ("a NaN weight", lambda good: Payload("full", 3, {"model.norm.weight": torch.full_like(good["model.norm.weight"], float("nan"))}), "NaN or infinite"),
    ("an inf weight", lambda good: Payload("full", 3, {"model.norm.weight": torch.full_like(good["model.norm.weight"], float("inf"))}), "NaN or infinite"),
    ("an int64 weight", lambda good: Payload("full", 3, {"model.norm.weight": torch.ones(64, dtype=torch.int64)}), "is int64; this model's is floating point"),
    ("a bool weight", lambda good: Payload("full", 3, {"model.norm.weight": torch.ones(64, dtype=torch.bool)}), "is bool"),
    ("a NaN LoRA scaling", lambda good: lora(float("nan")), "scaling holds NaN"),
    ("a 1e39 LoRA scaling", lambda good: lora(1e39), "NaN or infinite"),
]


def lora(scaling: float) -> Payload:
    module = "model.layers.0.mlp.up_proj"
    factors = {f"{module}.lora_A": torch.ones(2, 64), f"{module}.lora_B": torch.ones(128, 2)}
    return Payload("lora", 3, factors, {module: scaling})


@pytest.mark.parametrize("case", NOT_OK, ids=[c[0] for c in NOT_OK])
def test_a_poisoned_push_is_400_and_the_server_keeps_serving(served: Any, tiny_path: Path, case: Any):
    server, engine = served
    good = dict(fresh(tiny_path).state_dict())
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    reply = post(server, "", raw=encode(case[1](good)))
    assert reply.status_code == 400 and case[2] in reply.json()["error"]["message"], reply.text
    assert engine.weight_version == 0
    assert all(torch.equal(before[k], v) for k, v in engine.model.state_dict().items())
    chat_seconds(server)  # still answers


async def test_a_poisoned_channel_push_is_refused_the_same_way(served: Any, tiny_path: Path):
    server, engine = served
    state = dict(fresh(tiny_path).state_dict())
    state["model.norm.weight"] = torch.full_like(state["model.norm.weight"], float("nan"))
    channel = CollectiveChannel("gloo", AUTH)
    with pytest.raises(PushRefused, match="NaN or infinite"):
        await channel.send(server.url, payloads(state, {}, 1, whole=True, run="r"))
    channel.close()
    assert engine.weight_version == 0


@pytest.mark.parametrize(
    "version", [10**18, "\u00b2", "9" * 5000, "-1", "1.5", " 7"], ids=["1e18", "superscript", "5000-digits", "negative", "fraction", "space"]
)
def test_a_version_off_the_bounds_is_400_not_500_and_pins_nothing(served: Any, version: Any):
    from safetensors.torch import save

    server, engine = served
    body = save({"model.norm.weight": torch.ones(64)}, metadata={"kind": "full", "version": str(version)})
    reply = post(server, "", raw=body)
    manifest = post(server, "", {"channel": {"push": 0}, "kind": "full", "version": version, "tensors": []})
    assert reply.status_code == 400 and "from 0 to 1000000000000 in ASCII digits" in reply.text
    assert manifest.status_code == 400 and engine.weight_version == 0


def test_versions_are_ordered_within_a_run_and_a_new_run_takes_over(served: Any, tiny_path: Path):
    server, engine = served
    norm = {"model.norm.weight": dict(fresh(tiny_path).state_dict())["model.norm.weight"]}

    def push(version: int, run: str) -> int:
        return post(server, "", raw=encode(Payload("full", version, norm, run=run))).status_code

    assert [push(50, "old"), push(49, "old"), push(1, "resumed"), push(0, "resumed"), push(2, "resumed")] == [
        200, 409, 200, 409, 200,
    ]
    assert post(server, "", raw=encode(Payload("full", 1, norm, run="../../etc"))).status_code == 400
    health = httpx.get(f"{server.url}/health").json()
    assert (health["weight_run"], health["weight_version"], engine.weight_version) == ("resumed", 2, 2)


async def test_a_server_ahead_from_another_run_is_pushed_to_not_trusted(served: Any, tiny_path: Path):
    from bridges.grpo.server_pool import Identity, ServerPool
    from bridges.models.weight_payload import model_layout, tokenizer_fingerprint

    server, engine = served
    state = dict(fresh(tiny_path).state_dict())
    assert post(server, "", raw=encode(Payload("full", 50, state, run="earlier"))).status_code == 200
    identity = Identity(model_layout(str(tiny_path)), tokenizer_fingerprint(engine.tokenizer))
    follower = ServerPool.connect([server.url], identity, pusher=False, timeout=30, weights_key=KEY)
    follower.run = "resumed"
    await follower.follow(10)
    assert not follower.in_servers() and follower.servers[0].version == 50  # before: 50 >= 10 admitted it
    pool = ServerPool.connect([server.url], identity, pusher=True, timeout=30, weights_key=KEY)
    pool.run, pool.channel = "resumed", HttpChannel(AUTH)
    await pool.push(state, 10, whole=True)
    health = httpx.get(f"{server.url}/health").json()
    assert (health["weight_run"], health["weight_version"]) == ("resumed", 10) and pool.in_servers()
    await follower.follow(10)
    assert follower.in_servers(), follower.servers[0]


async def test_a_resumed_trainer_numbers_its_pushes_from_its_step(served: Any, tiny_path: Path):
    from bridges.grpo.server_pool import Identity, ServerPool
    from bridges.grpo.server_rollouts import ServerRollouts
    from bridges.models.weight_payload import model_layout, tokenizer_fingerprint
    from bridges.workflows.advantages import advantage_method

    server, engine = served
    identity = Identity(model_layout(str(tiny_path)), tokenizer_fingerprint(engine.tokenizer))
    pool = ServerPool.connect([server.url], identity, pusher=True, timeout=30, weights_key=KEY)
    pool.run, pool.version, pool.channel = "resumed", 7, HttpChannel(AUTH)  # as open_server_rollouts sets them
    await pool.check_all()
    rollouts = ServerRollouts(pool, None, 2, advantage_method("grpo"), gather_all=lambda m: dict(m.state_dict()),
                              barrier=lambda: None, wait_s=5)
    policy = fresh(tiny_path)
    await rollouts.update_weights(dict(policy.state_dict()), policy)
    await rollouts.update_weights(dict(policy.state_dict()), policy)
    assert engine.weight_version == 9 and httpx.get(f"{server.url}/health").json()["weight_run"] == "resumed"


def test_a_weights_key_equal_to_the_api_key_is_refused(capsys: pytest.CaptureFixture[str]):
    """Whoever may sample could otherwise change what everyone samples."""
    import bridges.serve
    from bridges.runs.config import run_cli

    with pytest.raises(SystemExit) as exit_info:
        run_cli(bridges.serve.main, ["api_key=same", "weights_key=same", "model=/no/such/model"])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and err == (
        "error: weights_key must differ from api_key: whoever may sample could change the weights."
    )


def test_a_manifest_nested_past_any_parser_is_400(served: Any):
    server, engine = served
    deep = b"[" * 100_000 + b"]" * 100_000
    reply = httpx.post(f"{server.url}/v1/weights", content=deep, timeout=60,
                       headers={**AUTH, "Content-Type": "application/json"})
    assert reply.status_code == 400 and "the manifest is nested too deeply" in reply.text and engine.weight_version == 0


@pytest.mark.slow
def test_a_server_stopped_while_a_join_hangs_exits_cleanly(tmp_path: Path):
    """Ctrl-C on ``bridges.serve`` with a join stuck inside torch's store client: one line and exit 0,
    not an abort at interpreter shutdown (a C++ call finishing under it)."""
    import signal

    from serve_process import WEIGHTS_KEY, ServeProcess

    peer = SilentPeer()
    served = ServeProcess(tmp_path / "serve.log").wait()
    try:
        join = {**JOIN, "port": peer.port, "timeout_s": 600}
        reply = httpx.post(f"{served.url}/v1/weights/channel", json=join, timeout=30,
                           headers={"Authorization": f"Bearer {WEIGHTS_KEY}"})
        assert reply.status_code == 200
        time.sleep(1.0)  # the join is inside the store client now
        served.process.send_signal(signal.SIGINT)
        code = served.process.wait(timeout=60)
    finally:
        served.kill()
        peer.close()
    log = (tmp_path / "serve.log").read_text()
    assert code == 0, log[-2000:]
    assert "a weight channel join still waits on a peer that never answered; exiting without it." in log
    assert "Traceback" not in log and "terminate called" not in log
