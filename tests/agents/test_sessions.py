"""Per-rollout sessions, called with the real openai SDK over loopback HTTP and in-process (no socket),
and with raw httpx: each session records exactly its own calls with the engine's ids, refuses unknown,
closed and over-cap calls in one sentence, applies the rollout's sampling arguments over the agent's,
and streams what it recorded; both carriers behave the same."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from bridges.agents.in_process import session_client
from bridges.agents.loopback import MAX_BODY_BYTES, LoopbackServer
from bridges.agents.sessions import SEED_STRIDE

HELLO = [{"role": "user", "content": "Say b"}]


@pytest.fixture(params=["loopback", "in-process"])
def sdk(request: Any, server: LoopbackServer) -> Any:
    """``sdk(session)``: the SDK on that session, over the loopback server or in-process."""

    def on(session: Any) -> openai.AsyncOpenAI:
        if request.param == "in-process":
            return session_client(server.sessions, session)
        return openai.AsyncOpenAI(base_url=server.base_url(session), api_key=session.id, max_retries=0)

    return on


async def test_each_session_records_its_own_calls_with_the_sampled_ids(
    server: LoopbackServer, scripted: Any, sdk: Any
):
    client, engine = scripted()
    first, second = server.sessions.open(client, "m", {}), server.sessions.open(client, "m", {})
    assert first.id != second.id and len(first.id) >= 32
    await sdk(first).chat.completions.create(model="gpt-4o", messages=HELLO)
    await sdk(second).chat.completions.create(model="x", messages=[{"role": "user", "content": "Say c"}])
    await sdk(first).chat.completions.create(model="x", messages=[{"role": "user", "content": "Say d"}])
    assert [len(first.responses), len(second.responses)] == [2, 1]
    recorded = [
        (tuple(r.prompt_token_ids), tuple(r.choices[0].token_ids))
        for r in (*first.responses, *second.responses)
    ]
    assert sorted(recorded) == sorted(engine.calls)  # every call's ids, each in its own session only
    assert [c[-1]["content"] for c in first.conversations] == ["Say b", "Say d"]
    assert first.responses[0].model == "m"  # the agent's model name is ignored: the rollout's policy answers


async def test_unknown_closed_and_over_cap_sessions_are_refused_in_one_sentence(
    server: LoopbackServer, scripted: Any, sdk: Any
):
    client, _ = scripted()
    session = server.sessions.open(client, "m", {}, max_calls=2)
    stranger = openai.AsyncOpenAI(base_url=f"{server.root}/s/not-a-session/v1", api_key="k", max_retries=0)
    with pytest.raises(openai.NotFoundError, match="no session has this id"):
        await stranger.chat.completions.create(model="m", messages=HELLO)
    for _ in range(2):
        await sdk(session).chat.completions.create(model="m", messages=HELLO)
    with pytest.raises(openai.RateLimitError, match=r"more than 2 model calls \(max_calls\)"):
        await sdk(session).chat.completions.create(model="m", messages=HELLO)
    assert (
        session.over_cap == "the agent made more than 2 model calls (max_calls)."
        and len(session.responses) == 2
    )
    server.sessions.close(session)
    with pytest.raises(openai.APIStatusError, match="its rollout has ended") as closed:
        await sdk(session).chat.completions.create(model="m", messages=HELLO)
    assert closed.value.status_code == 410 and len(session.responses) == 2


async def test_the_rollouts_sampling_arguments_win_and_each_call_gets_its_own_seed(
    server: LoopbackServer, scripted: Any, sdk: Any
):
    client, engine = scripted()
    params: list[Any] = []
    generate = engine.generate

    async def recording(prompt_ids: list[int], p: Any, n: int = 1) -> Any:
        params.append(p)
        return await generate(prompt_ids, p, n)

    engine.generate = recording
    session = server.sessions.open(client, "m", {"temperature": 0.7, "max_tokens": 5, "seed": 3, "n": 1})
    for _ in range(2):
        await sdk(session).chat.completions.create(
            model="gpt-4o", messages=HELLO, temperature=0.1, max_tokens=100, seed=99
        )
    assert [(p.temperature, p.max_tokens) for p in params] == [(0.7, 5), (0.7, 5)]
    assert [p.seed for p in params] == [3, 3 + SEED_STRIDE]


async def test_a_stream_carries_exactly_the_recorded_answer_tool_calls_included(
    server: LoopbackServer, scripted: Any, sdk: Any
):
    client, _ = scripted()
    session = server.sessions.open(client, "m", {})
    tools = [{"type": "function", "function": {"name": "shout", "parameters": {"type": "object", "properties": {
        "letter": {"type": "string"}, "times": {"type": "integer"}}}}}]
    for kwargs in ({}, {"tools": tools}):
        stream = await sdk(session).chat.completions.create(
            model="m", messages=HELLO, stream=True, stream_options={"include_usage": True}, **kwargs
        )
        chunks = [chunk async for chunk in stream]
        recorded = session.responses[-1]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == (recorded.choices[0].message.content or "")
        calls = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []]
        wanted = recorded.choices[0].message.tool_calls or []
        assert [(t.function.name, t.function.arguments) for t in calls] == [
            (t.function.name, t.function.arguments) for t in wanted
        ]
        assert chunks[-1].usage.completion_tokens == recorded.usage.completion_tokens
    assert session.responses[-1].choices[0].message.tool_calls  # the scripted model called the tool


async def test_hostile_requests_get_a_4xx_in_openai_shape_and_nothing_is_recorded(
    server: LoopbackServer, scripted: Any
):
    client, _ = scripted()
    session = server.sessions.open(client, "m", {})
    url = server.base_url(session)
    bad_call = {"role": "assistant", "tool_calls": [{"id": 1, "function": {"name": "f"}}]}
    async with httpx.AsyncClient(timeout=30) as http:
        answers = [
            await http.post(f"{url}/chat/completions", content=b"{not json"),
            await http.post(f"{url}/chat/completions", json=[1, 2]),
            await http.post(f"{url}/chat/completions", json={"messages": "hi"}),
            await http.post(f"{url}/chat/completions", json={"messages": [*HELLO, bad_call]}),
            await http.post(f"{url}/chat/completions", json={"messages": HELLO, "bogus_option": 1}),
            await http.post(f"{url}/chat/completions", json={"messages": HELLO, "n": 3}),
            await http.post(f"{url}/chat/completions", content=b" " * (MAX_BODY_BYTES + 1)),
            await http.get(f"{url}/chat/completions"),
            await http.post(f"{url}/../../s/{session.id}/v1/chat/completions", json={"messages": HELLO}),
            await http.get(f"{server.root}/etc/passwd"),
        ]
        models = await http.get(f"{url}/models")
    statuses = [a.status_code for a in answers]
    assert statuses[:7] == [400, 400, 400, 400, 400, 400, 413] and statuses[7] == 405, statuses
    assert answers[7].headers["Allow"] == "POST"
    assert all(400 <= s < 500 for s in statuses), statuses
    assert all(isinstance(a.json()["error"]["message"], str) for a in answers)
    assert "messages[1].tool_calls[0]" in answers[3].json()["error"]["message"]
    assert "'n' must be 1 on a session" in answers[5].json()["error"]["message"]
    assert statuses[8:] == [404, 404] and not session.responses  # '..' resolves to no session's path
    assert models.json()["data"][0]["id"] == "m"


async def test_in_process_a_session_answers_models_and_refuses_what_it_does_not_serve(
    server: LoopbackServer, scripted: Any
):
    client, _ = scripted()
    session = server.sessions.open(client, "policy", {})
    on_session = session_client(server.sessions, session)
    assert [m.id async for m in on_session.models.list()] == ["policy"]
    with pytest.raises(openai.NotFoundError, match="is not served on a session") as unserved:
        await on_session.embeddings.create(model="policy", input="x")
    assert unserved.value.body["code"] == "not_served" and session.responses == []
    await on_session.close()
