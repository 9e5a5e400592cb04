"""Attacks on ``bridges.serve`` (issue 53), each answered as stated, over real HTTP on the tiny model.

Before: ``n`` as a float slipped past ``max_n``; a float64 1e300 (finite only before the cast) or a norm
weight of 3e38 (finite, but the logits overflow) was taken and every later call was a 500; a lone
surrogate in a model name, an unknown key, a dialect's ``type`` or a session's sampling key was a 500;
session sampling (``stream``, a NaN or negative ``timeout``) was taken at open and failed every call;
bodies and tool arguments nested 500-975 deep on session routes, and safetensors metadata or a manifest
nested 100,000 deep or holding 10**400, were 500s; a 70,000-byte channel join was a 500; concurrent
calls passed a session's sampled and prompt caps N times over; ``Host`` decided a session's
``base_url``; session ids reached the access log through ``//s/ID``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from bridges.models.weight_payload import Payload, encode
from bridges.server.app import ServeLimits, WeightUpdates, serve_in_thread

KEY, WEIGHTS = "ak", "wk"
CHAT = "/v1/chat/completions"
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def served(tiny_path: Path, tiny_tokenizer: Any) -> Iterator[tuple[Any, Any]]:
    from transformers import AutoModelForCausalLM

    from bridges.adapters.hf import HFEngine
    from bridges.client import EngineClient

    model = AutoModelForCausalLM.from_pretrained(tiny_path).eval()
    engine = HFEngine(model, tiny_tokenizer)
    limits = ServeLimits(model_names=("tiny",), max_n=16)
    client = EngineClient(engine, model_name="tiny")
    with serve_in_thread(client, api_key=KEY, limits=limits, updates=WeightUpdates(WEIGHTS, model)) as server:
        yield server, engine
    engine.close()


@pytest.fixture(scope="module")
def http(served: tuple[Any, Any]) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served[0].url, timeout=120, headers={"Authorization": f"Bearer {KEY}"}) as client:
        yield client


def raw_post(http: httpx.Client, path: str, text: str, **headers: str) -> httpx.Response:
    """A body written by hand: JSON escapes such as a lone \\ud800 travel as the six ASCII characters."""
    return http.post(path, content=text.encode(), headers={"content-type": "application/json", **headers})


def session(http: httpx.Client, **body: Any) -> str:
    opened = http.post("/v1/sessions", json=body)
    assert opened.status_code == 201, opened.text
    return str(opened.json()["id"])


def assert_refused(reply: httpx.Response, status: int, *pieces: str) -> None:
    assert reply.status_code == status, reply.text[:500]
    message = reply.json()["error"]["message"]
    assert all(piece in message for piece in pieces), message


@pytest.mark.parametrize("path", [CHAT, "/v1/completions"])
@pytest.mark.parametrize("n", [17.0, 40.0, 17.5])
def test_n_is_checked_by_its_value(http: httpx.Client, path: str, n: float):
    body = {"model": "tiny", "max_tokens": 2, "n": n, **({"messages": USER} if path == CHAT else {"prompt": "hi"})}
    reply = http.post(path, json=body)
    assert_refused(reply, 400, "'n' must be")
    assert http.post(path, json={**body, "n": 2.0}).json()["choices"][1]["index"] == 1  # 2.0 is 2


SURROGATE_BODIES = [
    (CHAT, '{"model": "\\ud800", "messages": [{"role": "user", "content": "hi"}]}', "'model'"),
    (CHAT, '{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "\\udfff": 1}', "'\\udfff'"),
    ("/v1/completions", '{"model": "\\ud800", "prompt": "hi"}', "'model'"),
]


@pytest.mark.parametrize(("path", "text", "where"), SURROGATE_BODIES)
def test_a_lone_surrogate_anywhere_in_a_body_is_400(http: httpx.Client, path: str, text: str, where: str):
    assert_refused(raw_post(http, path, text), 400, where, "unpaired UTF-16 surrogate")


@pytest.mark.parametrize(("route", "text"), [
    ("chat/completions", '{"messages": [{"role": "user", "content": "hi"}], "model": "\\ud800"}'),
    ("responses", '{"input": [{"type": "\\ud800", "content": "x"}]}'),
    ("responses", '{"input": [{"type": "message", "role": "user", "content": [{"type": "\\ud800"}]}]}'),
    ("responses", '{"input": "hi", "tools": [{"type": "\\ud800"}]}'),
    ("messages", '{"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "\\ud800"}]}]}'),
    ("messages", '{"max_tokens": 4, "system": [{"type": "\\ud800"}], "messages": [{"role": "user", "content": "hi"}]}'),
])
def test_a_lone_surrogate_on_a_session_route_is_400_in_the_routes_shape(http: httpx.Client, route: str, text: str):
    reply = raw_post(http, f"/s/{session(http)}/v1/{route}", text)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert "unpaired UTF-16 surrogate" in error["message"]
    assert (error["type"] == "invalid_request_error") if route != "messages" else reply.json()["type"] == "error"


@pytest.mark.parametrize(("sampling", "pieces"), [
    ({"stream": True}, ("'sampling.stream' is not a sampling argument",)),
    ({"timeout": float("nan")}, ("'sampling.timeout' must be at least 1 second",)),
    ({"timeout": -1}, ("'sampling.timeout'",)),
    ({"timeout": 1e-9}, ("'sampling.timeout'",)),
    ({"timeout": 5e58}, ("'timeout' must be a number of seconds above 0 and at most 86400",)),
    ({"n": 3}, ("'sampling.n' must be 1",)),
    ({"temperature": 9}, ("'sampling':", "temperature")),
    ({"no_such_key": 1}, ("'sampling':", "no_such_key")),
    ({"\ud800": 1}, ("unpaired UTF-16 surrogate",)),
])
def test_session_sampling_is_checked_when_it_opens(http: httpx.Client, sampling: dict[str, Any], pieces: tuple[str]):
    text = json.dumps({"sampling": sampling}, allow_nan=True)
    assert_refused(raw_post(http, "/v1/sessions", text), 400, *pieces)


def test_a_session_opens_without_a_body_but_not_with_a_body_that_is_not_json(http: httpx.Client):
    assert http.post("/v1/sessions").status_code == 201
    assert raw_post(http, "/v1/sessions", "\t").status_code == 400  # whitespace is not a JSON document


@pytest.mark.parametrize(("route", "body", "piece"), [
    ("chat/completions", {"model": 4.7e16, "messages": USER}, "'model' must be string"),
    ("responses", {"input": ""}, "'input' is required and not empty"),
    ("responses", {"input": []}, "'input' is required and not empty"),
])
def test_what_the_document_refuses_on_a_session_route_is_refused(http: httpx.Client, route: str,
                                                                  body: dict[str, Any], piece: str):
    assert_refused(http.post(f"/s/{session(http)}/v1/{route}", json=body), 400, piece)


def test_a_session_that_opened_answers_and_can_always_be_read_and_closed(http: httpx.Client):
    sid = session(http, sampling={"timeout": 30, "max_tokens": 3, "metadata": {"big": "x" * 1000}, "user": "u"})
    reply = http.post(f"/s/{sid}/v1/chat/completions", json={"model": "any", "messages": USER})
    assert reply.status_code == 200 and len(reply.json()["choices"][0]["token_ids"]) <= 3
    assert http.get(f"/v1/sessions/{sid}").status_code == 200
    assert http.delete(f"/v1/sessions/{sid}").json()["turns"][0]["completion_ids"]
    assert_refused(http.post("/v1/sessions", json={"max_cals": 3}), 400, "'max_cals' is not a session setting")


def nested(depth: int) -> str:
    """A JSON schema nested ``depth`` objects deep, as text (json.dumps itself stops near 1,000)."""
    return '{"type": "object", "properties": {"x": ' * depth + '{"type": "string"}' + "}}" * depth


@pytest.mark.parametrize("route", ["sessions", "plain"])
def test_depth_is_one_rule_on_every_route(http: httpx.Client, route: str):
    path = f"/s/{session(http)}/v1/chat/completions" if route == "sessions" else CHAT
    tool = '{"type": "function", "function": {"name": "f", "parameters": ' + nested(500) + "}}"
    body = '{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "tools": [' + tool + "]}"
    assert_refused(raw_post(http, path, body), 400, "nested too deeply")
    deep = "[" * 975 + "]" * 975
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": deep}}
    messages = [*USER, {"role": "assistant", "content": None, "tool_calls": [call]}]
    reply = http.post(path, json={"model": "tiny", "messages": messages, "max_tokens": 2})
    assert_refused(reply, 400, "'messages[1].tool_calls[0].function.arguments' is nested too deeply")
    call["function"]["arguments"] = "not JSON: the model's own words"  # text that is not JSON stays text
    assert http.post(path, json={"model": "tiny", "messages": messages, "max_tokens": 2}).status_code == 200


def weights(http: httpx.Client, body: bytes, content_type: str = "application/octet-stream",
            path: str = "/v1/weights") -> httpx.Response:
    return http.post(path, content=body, headers={"Authorization": f"Bearer {WEIGHTS}", "content-type": content_type})


def safetensors_with(metadata: dict[str, str], tensors: dict[str, torch.Tensor]) -> bytes:
    from safetensors.torch import save

    return save(tensors, metadata=metadata)


def test_weight_metadata_and_manifests_follow_the_rule(http: httpx.Client, served: tuple[Any, Any]):
    engine = served[1]
    norm = {"model.norm.weight": engine.model.model.norm.weight.detach().clone()}
    for scaling in ("[" * 100_000 + "]" * 100_000, '{"a": 1' + "0" * 400 + "}"):
        reply = weights(http, safetensors_with({"kind": "full", "version": "1", "scaling": scaling}, norm))
        assert reply.status_code == 400, reply.text
    manifest = {"channel": {"push": 1}, "kind": "lora", "version": 1, "scaling": {"a": 10**400}, "tensors": []}
    assert_refused(weights(http, json.dumps(manifest).encode(), "application/json"), 400, "finite numbers")
    join = json.dumps({"host": "127.0.0.1", "port": 1, "prefix": "p", "backend": "gloo", "pad": "x" * 70_000})
    reply = weights(http, join.encode(), "application/json", "/v1/weights/channel")
    assert reply.status_code == 413 and reply.json()["error"]["code"] == "body_too_large"
    assert engine.weight_version == 0


def test_weights_finite_only_before_the_cast_or_that_overflow_the_logits_are_refused_and_nothing_changes(
        http: httpx.Client, served: tuple[Any, Any]):
    engine = served[1]
    before = {k: v.detach().clone() for k, v in engine.model.state_dict().items()}
    huge = {"model.norm.weight": torch.full_like(before["model.norm.weight"], 1e300, dtype=torch.float64)}
    assert_refused(weights(http, encode(Payload("full", 1, huge))), 400, "once cast to the model's float32")
    overflow = {"model.norm.weight": torch.full_like(before["model.norm.weight"], 3e38)}
    assert_refused(weights(http, encode(Payload("full", 1, overflow))), 400, "logits NaN or infinite", "rolled back")
    assert all(torch.equal(v, before[k]) for k, v in engine.model.state_dict().items())
    assert engine.weight_version == 0
    reply = http.post(CHAT, json={"model": "tiny", "messages": USER, "max_tokens": 2})
    assert reply.status_code == 200 and reply.json()["weight_version"] == 0


async def test_concurrent_calls_never_pass_a_sessions_sampled_cap_and_pass_the_prompt_cap_by_one_prompt(
        served: tuple[Any, Any]):
    server = served[0]
    headers = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(base_url=server.url, timeout=120, headers=headers) as http:
        async def twelve(cap: dict[str, int]) -> tuple[list[int], dict[str, Any]]:
            sid = (await http.post("/v1/sessions", json=cap)).json()["id"]
            body = {"model": "any", "messages": USER, "max_tokens": 32}
            replies = await asyncio.gather(*(http.post(f"/s/{sid}/v1/chat/completions", json=body) for _ in range(12)))
            return [r.status_code for r in replies], (await http.delete(f"/v1/sessions/{sid}")).json()

        statuses, record = await twelve({"max_sampled_tokens": 1})
        assert statuses.count(200) == 1 and statuses.count(429) == 11, statuses
        assert sum(len(t["completion_ids"]) for t in record["turns"]) == 1
        statuses, record = await twelve({"max_prompt_tokens": 1})
        assert statuses.count(200) == 1 and statuses.count(429) == 11, statuses
        assert len(record["turns"]) == 1  # one call's prompt past the cap, as the docs allow, never twelve


def test_base_url_is_the_servers_own_never_the_host_header(http: httpx.Client, served: tuple[Any, Any]):
    opened = http.post("/v1/sessions", json={}, headers={"Host": "evil.example:1"})
    assert opened.status_code == 201
    assert opened.json()["base_url"].startswith(served[0].url) and "evil" not in opened.text
    slash = http.get("/v1/models/", headers={"Host": "evil.example:1"})
    assert slash.status_code == 404 and "evil" not in slash.headers.get("location", "")


def test_every_path_that_carries_a_session_id_is_masked_in_the_access_log(capfd: pytest.CaptureFixture[str],
                                                                           scripted: Any):
    client, _ = scripted()
    with serve_in_thread(client, limits=ServeLimits(access_log=True)) as server:
        sid = httpx.post(f"{server.url}/v1/sessions", json={}).json()["id"]
        for path in (f"//s/{sid}/v1/models", f"/v1/../s/{sid}/v1/models", f"/./s/{sid}/v1/models",
                     f"/s/{sid}/v1/models", f"/v1/sessions/{sid}"):
            with httpx.Client() as plain:
                plain.send(plain.build_request("GET", f"{server.url}{path}"))
    err = capfd.readouterr().err
    assert "<session>" in err and sid not in err and sid[:12] not in err


def test_a_message_key_nothing_renders_is_not_kept(http: httpx.Client):
    import tracemalloc

    sid = session(http)
    junk = {"role": "user", "content": "hi", "junk": "x" * (4 * 1024 * 1024)}
    body = json.dumps({"model": "any", "messages": [junk], "max_tokens": 2}).encode()  # made before counting
    tracemalloc.start()
    status = http.post(f"/s/{sid}/v1/chat/completions", content=body).status_code
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert status == 200
    assert held < 2 * 1024 * 1024, held  # the 4 MiB key went with the request, not into the record


def rss_bytes() -> int:
    with open("/proc/self/status") as status:
        line = next(x for x in status if x.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def test_a_sessions_settings_cost_what_they_hold_and_count_against_the_budget(scripted: Any):
    """Read from RSS: ten sessions opened with an 8 MiB ``sampling`` of no-op keys keep none of it (162 MB
    a session before); settings a session does keep (its stop strings) are charged to the server's budget."""
    import gc

    from bridges.runtime.http_server import ServerThread
    from bridges.server.app import create_app

    client, _ = scripted()
    app = create_app(client)
    endpoints = next(r.endpoint.__self__ for r in app.routes if getattr(r, "path", "") == "/v1/sessions")
    big = json.dumps({"sampling": {"metadata": {"k": "x" * (8 * 1024 * 1024 - 100)}, "max_tokens": 2}}).encode()
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        raw_post(http, "/v1/sessions", "{}")  # the first request's one-time allocations, before counting
        gc.collect()
        before = rss_bytes()
        statuses = [http.post("/v1/sessions", content=big).status_code for _ in range(10)]
        gc.collect()
        assert statuses == [201] * 10
        # before: 162 MB a session; what is left is the allocator keeping freed 8 MiB parses, not held objects
        assert rss_bytes() - before < 64 * 1024 * 1024, (rss_bytes() - before) / 2**20
        used = endpoints.sessions.budget.used
        sid = session(http, sampling={"stop": ["s" * 1000] * 100})
        assert endpoints.sessions.budget.used - used >= 100_000  # the kept stop strings are counted
        http.delete(f"/v1/sessions/{sid}")
        assert endpoints.sessions.budget.used == used


def test_a_finite_lora_whose_merge_overflows_the_forward_is_rolled_back(http: httpx.Client, served: tuple[Any, Any]):
    """Ones factors of rank 1 scaled by 3e38 on an output projection: every merged value is finite (3e38 +
    base), the residual stream is not. (On q_proj the same merge is taken: attention saturates, logits stay
    finite, the model answers.)"""
    engine = served[1]
    module = "model.layers.0.self_attn.o_proj"
    weight = engine.model.state_dict()[f"{module}.weight"]
    before = weight.clone()
    factors = {f"{module}.lora_A": torch.ones(1, weight.shape[1]), f"{module}.lora_B": torch.ones(weight.shape[0], 1)}
    reply = weights(http, encode(Payload("lora", 1, factors, {module: 3e38})))
    assert_refused(reply, 400, "logits NaN or infinite", "rolled back")
    assert torch.equal(engine.model.state_dict()[f"{module}.weight"], before) and engine.weight_version == 0
