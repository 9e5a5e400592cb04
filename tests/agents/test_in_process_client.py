"""The in-process session client's direct path (a raw-response POST answered without the SDK's request
machinery) and its bound form (one client for many rollouts, each call the session of its context):
the same answers, records and refusals as the SDK path, and no call lands in another rollout's record."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import openai
import pytest

from bridges.agents.in_process import bound_client, bound_to, session_client
from bridges.agents.sessions import Sessions

HELLO = [{"role": "user", "content": "Say b"}]


def _comparable(payload: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in payload.items() if k not in ("id", "created")}


async def test_a_raw_post_answers_and_records_as_the_sdk_path_does(scripted: Any):
    client, engine = scripted()
    sessions = Sessions()
    direct, through_sdk = (sessions.open(client, "m", {"max_tokens": 8, "seed": 3}) for _ in range(2))
    raw = await session_client(sessions, direct).post(
        "/chat/completions", body={"model": "x", "messages": HELLO}, cast_to=httpx.Response
    )
    typed = await session_client(sessions, through_sdk).chat.completions.create(model="x", messages=HELLO)
    assert isinstance(raw, httpx.Response) and raw.status_code == 200
    assert _comparable(raw.json()) == _comparable(typed.model_dump(mode="json", exclude_unset=True))
    assert raw.json()["choices"][0]["token_ids"]  # the engine's ids travel in the reply as over HTTP
    assert len(direct.responses) == len(through_sdk.responses) == 1 and len(engine.calls) == 2
    assert direct.responses[0].choices[0].token_ids == typed.choices[0].token_ids


async def test_a_raw_post_is_refused_in_the_sdk_s_own_error_types(scripted: Any):
    client, _ = scripted()
    sessions = Sessions()
    session = sessions.open(client, "m", {}, max_calls=1)
    on_session = session_client(sessions, session)
    with pytest.raises(TypeError, match="cannot be sent as JSON"):  # as the SDK's encoder refuses it
        await on_session.post(
            "/chat/completions", body={"messages": HELLO, "bad": {1, 2}}, cast_to=httpx.Response
        )
    bad = await asyncio.gather(
        on_session.post("/chat/completions", body={"messages": "hi"}, cast_to=httpx.Response),
        return_exceptions=True,
    )
    assert isinstance(bad[0], openai.BadRequestError) and "'messages' must be a list" in str(bad[0])
    await on_session.post("/chat/completions", body={"messages": HELLO}, cast_to=httpx.Response)
    with pytest.raises(openai.RateLimitError, match="cap"):
        await on_session.post("/chat/completions", body={"messages": HELLO}, cast_to=httpx.Response)
    sessions.close(session)
    with pytest.raises(openai.APIStatusError, match="closed") as closed:
        await on_session.post("/chat/completions", body={"messages": HELLO}, cast_to=httpx.Response)
    assert closed.value.status_code == 410 and len(session.responses) == 1


async def test_a_bound_client_answers_each_call_on_the_session_of_its_context(scripted: Any):
    client, _ = scripted()
    sessions = Sessions()
    shared = bound_client(sessions)
    first, second = sessions.open(client, "m", {}), sessions.open(client, "m", {})
    late: list[asyncio.Task[Any]] = []

    async def rollout(session: Any, calls: int) -> None:
        with bound_to(session):
            for _ in range(calls):
                await shared.post("/chat/completions", body={"messages": HELLO}, cast_to=httpx.Response)
            await shared.chat.completions.create(model="x", messages=HELLO)  # the SDK path, same session
            if session is first:  # a task the rollout starts and leaves running carries its session along
                late.append(asyncio.create_task(_later(shared)))

    await asyncio.gather(rollout(first, 2), rollout(second, 1))
    assert (len(first.responses), len(second.responses)) == (3, 2)
    sessions.close(first)
    outcome = (await asyncio.gather(*late, return_exceptions=True))[0]
    assert isinstance(outcome, openai.APIStatusError) and outcome.status_code == 410  # not second's record
    assert len(second.responses) == 2
    with pytest.raises(openai.NotFoundError, match="no session has this id"):  # outside every rollout
        await shared.post("/chat/completions", body={"messages": HELLO}, cast_to=httpx.Response)
    assert (
        first.conversations[0] == HELLO and first.last_exchange()[0] == HELLO[0]
    )  # as sent, read normalised


async def _later(client: Any) -> Any:
    await asyncio.sleep(0.05)
    return await client.post("/chat/completions", body={"messages": HELLO}, cast_to=httpx.Response)
