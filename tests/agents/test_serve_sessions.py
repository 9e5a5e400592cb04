"""Per-rollout sessions on ``bridges.serve``: opened and read back under the server's API key, called
by an agent with nothing but their URL, in all three dialects; isolated, capped, closed with 410."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import openai
import pytest

from bridges.server.app import serve_in_thread

KEY = {"Authorization": "Bearer s3cret"}


async def test_a_harness_opens_a_session_an_agent_calls_it_and_the_turns_come_back(scripted: Any):
    client, engine = scripted()
    with serve_in_thread(client, api_key="s3cret") as server:
        async with httpx.AsyncClient(timeout=60) as http:
            assert (await http.post(f"{server.base_url}/sessions")).status_code == 401
            opened = (await http.post(f"{server.base_url}/sessions", headers=KEY, json={
                "max_calls": 3, "sampling": {"temperature": 1.0, "max_tokens": 32}})).json()
            other = (await http.post(f"{server.base_url}/sessions", headers=KEY)).json()
            agent = openai.AsyncOpenAI(base_url=opened["base_url"], api_key="anything", max_retries=0)
            await agent.chat.completions.create(model="x", messages=[{"role": "user", "content": "Say b"}])
            await agent.responses.create(model="x", input="Say c")
            claude = anthropic.AsyncAnthropic(base_url=opened["anthropic_base_url"], api_key="x", max_retries=0)
            await claude.messages.create(model="x", max_tokens=8, messages=[{"role": "user", "content": "Say d"}])
            with pytest.raises(openai.RateLimitError, match="max_calls"):
                await agent.chat.completions.create(model="x", messages=[{"role": "user", "content": "Say e"}])
            shown = (await http.get(f"{server.base_url}/sessions/{opened['id']}", headers=KEY)).json()
            closed = (await http.delete(f"{server.base_url}/sessions/{opened['id']}", headers=KEY)).json()
            late = await http.post(f"{opened['base_url']}/chat/completions", json={"messages": []})
            untouched = (await http.get(f"{server.base_url}/sessions/{other['id']}", headers=KEY)).json()
            wrong_method = await http.put(f"{server.base_url}/sessions/{other['id']}", headers=KEY)
    assert shown["open"] and not closed["open"] and shown["turns"] == closed["turns"]
    assert shown["over_cap"] == "the agent made more than 3 model calls (max_calls)."
    assert [(tuple(t["prompt_ids"]), tuple(t["completion_ids"])) for t in shown["turns"]] == engine.calls
    assert all(len(t["completion_ids"]) == len(t["logprobs"]) > 0 for t in shown["turns"])
    assert late.status_code == 410 and untouched["turns"] == [] and untouched["open"]
    assert wrong_method.status_code == 405 and wrong_method.headers["Allow"] == "DELETE, GET, HEAD"


async def test_bad_session_requests_are_one_sentence(scripted: Any):
    client, _ = scripted()
    with serve_in_thread(client) as server:
        async with httpx.AsyncClient(timeout=60) as http:
            answers = [
                await http.post(f"{server.base_url}/sessions", json={"max_calls": 0}),
                await http.post(f"{server.base_url}/sessions", json={"sampling": "hot"}),
                await http.post(f"{server.base_url}/sessions", content=b"{oops"),
                await http.get(f"{server.base_url}/sessions/nope"),
                await http.post(f"{server.url}/s/nope/v1/messages", json={"max_tokens": 1, "messages": []}),
            ]
    assert [a.status_code for a in answers] == [400, 400, 400, 404, 404]
    assert "'max_calls' must be an integer from 1 to 1024." in answers[0].text
    assert answers[4].json()["type"] == "error"  # the Anthropic route answers in Anthropic's error shape
