"""Attacks on bridges.serve's sessions (issue 40, items 5-6): bodies of the wrong types on the Responses
and Messages routes, caps past any sane size, sessions left open by a crashed harness, and records
that grow without bound.

Before: ``previous_response_id`` a list, ``tools`` a number, an input ``role`` a list, or a Messages
``messages``/``stop_sequences`` a number answered 500; ``max_calls=10**18`` was taken; a session
stayed open until restart; prompt tokens were not capped, so 1,024 sessions could hold ~90 GiB."""

from __future__ import annotations

import asyncio
import time
import tracemalloc
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from bridges.agents.sessions import Sessions, TokenBudget, answer_chat, recorded_bytes
from bridges.server.app import serve_in_thread


@pytest.fixture
def server(scripted: Any) -> Iterator[Any]:
    client, _ = scripted()
    with serve_in_thread(client) as served:
        yield served


def open_session(server: Any, **body: Any) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/sessions", json=body, timeout=30)


BAD_TYPES = [
    ("responses", {"input": "hi", "previous_response_id": ["resp_1"]}, "'previous_response_id' must be string"),
    ("responses", {"input": "hi", "tools": 7}, "'tools' must be array"),
    ("responses", {"input": [{"type": "message", "role": ["user"], "content": "hi"}]}, "not a well-formed Responses request"),
    ("responses", {"input": 3}, "'input' must be string or array"),
    ("responses", {"input": "hi", "max_output_tokens": True}, "'max_output_tokens' must be integer"),
    ("messages", {"max_tokens": 8, "messages": 5}, "'messages' must be array"),
    ("messages", {"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], "stop_sequences": 4}, "'stop_sequences' must be array"),
    ("messages", {"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], "system": {"a": 1}}, "'system' must be string or array"),
]


@pytest.mark.parametrize(("route", "body", "words"), BAD_TYPES, ids=[f"{r}-{w[:24]}" for r, _, w in BAD_TYPES])
def test_a_body_of_the_wrong_types_is_400_in_the_routes_own_shape(server: Any, route: str, body: Any, words: str):
    base = open_session(server).json()["base_url"]
    reply = httpx.post(f"{base}/{route}", json=body, timeout=30)
    assert reply.status_code == 400 and words in reply.text, reply.text
    error = reply.json()["error"]
    assert reply.json()["type"] == "error" if route == "messages" else "code" in error  # Anthropic's or OpenAI's


@pytest.mark.parametrize(
    ("body", "words"),
    [({"max_calls": 10**18}, "'max_calls' must be an integer from 1 to 1024"),
     ({"max_sampled_tokens": 0}, "'max_sampled_tokens' must be an integer from 1 to 1048576"),
     ({"max_prompt_tokens": 2**40}, "'max_prompt_tokens' must be an integer from 1 to 4194304"),
     ({"max_calls": True}, "'max_calls' must be an integer")],
)
def test_caps_past_the_servers_ceilings_are_refused(server: Any, body: dict[str, Any], words: str):
    reply = open_session(server, **body)
    assert reply.status_code == 400 and words in reply.json()["error"]["message"]
    assert open_session(server, max_calls=4.0).status_code == 201  # JSON has one number type


def test_prompt_tokens_summed_over_calls_are_capped(server: Any):
    base = open_session(server, max_prompt_tokens=10).json()["base_url"]
    body = {"model": "any", "messages": [{"role": "user", "content": "a prompt longer than ten tokens, surely"}]}
    first = httpx.post(f"{base}/chat/completions", json=body, timeout=30)
    second = httpx.post(f"{base}/chat/completions", json=body, timeout=30)
    assert first.status_code == 200 and second.status_code == 429
    assert "prompts summed to more than 10 tokens (max_prompt_tokens)" in second.json()["error"]["message"]


async def test_an_idle_session_is_closed_and_frees_its_place_and_memory(scripted: Any):
    client, _ = scripted()
    sessions = Sessions(idle_s=0.2, budget=TokenBudget(limit=10**9))
    forgotten = sessions.open(client, "m", {"max_tokens": 4})
    assert (await answer_chat(forgotten, {"messages": [{"role": "user", "content": "hi"}]}))[0] == 200
    assert sessions.budget is not None and sessions.budget.used == forgotten.held_bytes > 0
    await asyncio.sleep(1.1)  # past idle_s and the once-a-second scan
    kept = sessions.open(client, "m", {"max_tokens": 4})
    assert len(sessions) == 1 and forgotten.closed and sessions.budget.used == 0
    with pytest.raises(Exception, match="this session is closed"):
        sessions.find(forgotten.id)
    assert sessions.find(kept.id) is kept


async def test_the_servers_sessions_share_one_memory_budget(scripted: Any):
    client, _ = scripted()
    sessions = Sessions(budget=TokenBudget(limit=1))
    first, second = (sessions.open(client, "m", {"max_tokens": 4}) for _ in range(2))
    message = {"messages": [{"role": "user", "content": "hi"}]}
    assert (await answer_chat(first, message))[0] == 200
    status, body, _ = await answer_chat(second, message)
    assert status == 429 and body is not None and body["error"]["code"] == "server_sessions_full"
    sessions.close(first)
    assert (await answer_chat(second, message))[0] == 200


@pytest.mark.parametrize("top_logprobs", [0, 20])
async def test_the_memory_estimate_covers_what_a_record_holds(hf_engine: Any, top_logprobs: int):
    """``recorded_bytes`` is what the budget counts: it must not undercount what the record holds
    (measured with tracemalloc over six multi-turn calls), nor overcount it wildly."""
    from bridges.client import EngineClient

    client = EngineClient(hf_engine, model_name="tiny")
    sampling = {"max_tokens": 32, "logprobs": True, **({"top_logprobs": top_logprobs} if top_logprobs else {})}
    session = Sessions().open(client, "tiny", sampling, max_calls=100)
    text = " ".join(f"word{i}" for i in range(100))
    await answer_chat(session, {"messages": [{"role": "user", "content": "warm up"}]})
    held_before, messages = session.held_bytes, [{"role": "user", "content": text}]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(6):
            status, _, response = await answer_chat(session, {"messages": messages})
            assert status == 200
            reply = response.choices[0].message.content or "."
            messages = [*messages, {"role": "assistant", "content": reply}, {"role": "user", "content": text[:300]}]
        del status, response
        measured = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    estimated = session.held_bytes - held_before
    assert measured <= estimated <= 4 * measured, (measured, estimated)
    assert recorded_bytes(None, 10, 1) == 80 * 10 + 300
    assert time.monotonic() - session.last_used < 60


def test_the_access_log_never_prints_a_session_id(scripted: Any, capfd: pytest.CaptureFixture[str]):
    """A session's id is its capability: a log reader must not be able to call the session."""
    from bridges.server.app import ServeLimits

    client, _ = scripted()
    with serve_in_thread(client, limits=ServeLimits(access_log=True)) as served:
        opened = open_session(served).json()
        httpx.post(f"{opened['base_url']}/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        httpx.get(f"{served.url}/v1/sessions/{opened['id']}")
    log = capfd.readouterr().err
    assert opened["id"] not in log
    assert "POST /s/<session>/v1/chat/completions 200" in log and "GET /v1/sessions/<session> 200" in log
