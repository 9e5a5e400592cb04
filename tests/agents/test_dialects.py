"""OpenAI Responses and Anthropic Messages on a session, called with the real openai and anthropic SDKs
(and the OpenAI Agents SDK's default Responses model): both enter the same ledger as chat, so a tool
round trip in either dialect is two turns of one token-exact sample, streamed or not."""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import pytest

from bridges.agents.loopback import LoopbackServer
from bridges.workflows.samples import SampleStats, turns_to_samples

SHOUT_SCHEMA = {"type": "object", "properties": {"letter": {"type": "string"}, "times": {"type": "integer"}}}


def one_sample(session: Any) -> bool:
    """Every call of the session extended the one before it: one sample, no break."""
    from bridges.envs.multiturn import turn_from_response

    stats = SampleStats()
    turns_to_samples([turn_from_response(r) for r in session.responses], advantage=1.0, reward=1.0,
                     example_id=0, stats=stats)
    return stats.samples == 1 and stats.breaks == 0


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_responses_tool_round_trip_is_one_sample(server: LoopbackServer, scripted: Any, stream: bool):
    client, engine = scripted()
    session = server.sessions.open(client, "policy", {"max_tokens": 64})
    sdk = openai.AsyncOpenAI(base_url=server.base_url(session), api_key=session.id, max_retries=0)
    tools: Any = [{"type": "function", "name": "shout", "parameters": SHOUT_SCHEMA}]
    asked: Any = [{"role": "user", "content": "Say b"}]

    async def ask(**kwargs: Any) -> Any:
        if not stream:
            return await sdk.responses.create(model="any", tools=tools, instructions="Be brief.", **kwargs)
        async with sdk.responses.stream(model="any", tools=tools, instructions="Be brief.", **kwargs) as events:
            return await events.get_final_response()

    first = await ask(input=asked)
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "shout" and first.status == "completed"
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "xxxxxx"}
    second = await ask(input=[*asked, {"type": "function_call", "call_id": call.call_id, "name": call.name,
                                       "arguments": call.arguments}, result])
    assert second.output_text == "xxxxxx" and second.usage.output_tokens == len(engine.calls[-1][1])
    third = await ask(input=[{"role": "user", "content": "Again."}], previous_response_id=second.id)
    assert len(session.responses) == 3 and one_sample(session)
    assert session.conversations[-1][-1] == {"role": "user", "content": "Again."} and third.output


async def test_the_openai_agents_sdks_default_responses_model_runs_unchanged(server: LoopbackServer, scripted: Any):
    from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    client, _ = scripted()
    session = server.sessions.open(client, "policy", {"max_tokens": 64})
    sdk = openai.AsyncOpenAI(base_url=server.base_url(session), api_key=session.id, max_retries=0)

    def shout(letter: str, times: int) -> str:
        """Repeat a letter."""
        return letter * times

    agent = Agent(name="letters", instructions="Be brief.", tools=[function_tool(shout)],
                  model=OpenAIResponsesModel(model="policy", openai_client=sdk))
    result = await Runner.run(agent, "Say b", max_turns=4)
    assert result.final_output == "xxxxxx" and len(session.responses) == 2 and one_sample(session)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_an_anthropic_messages_tool_round_trip_is_one_sample(server: LoopbackServer, scripted: Any, stream: bool):
    client, _ = scripted()
    session = server.sessions.open(client, "policy", {"max_tokens": 64})
    sdk = anthropic.AsyncAnthropic(base_url=server.session_root(session), api_key=session.id, max_retries=0)
    tools: Any = [{"name": "shout", "description": "Repeat a letter.", "input_schema": SHOUT_SCHEMA}]
    messages: list[Any] = [{"role": "user", "content": "Say b"}]

    async def ask() -> Any:
        if not stream:
            return await sdk.messages.create(model="any", max_tokens=64, system="Be brief.", tools=tools, messages=messages)
        async with sdk.messages.stream(model="any", max_tokens=64, system="Be brief.", tools=tools,
                                       messages=messages) as events:
            return await events.get_final_message()

    first = await ask()
    (use,) = [block for block in first.content if block.type == "tool_use"]
    assert first.stop_reason == "tool_use" and use.name == "shout" and use.input == {"letter": "x", "times": 6}
    messages += [{"role": "assistant", "content": [b.model_dump() for b in first.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "xxxxxx"}]}]
    second = await ask()
    assert second.stop_reason == "end_turn" and second.content[0].text == "xxxxxx"
    assert len(session.responses) == 2 and one_sample(session)


async def test_what_a_dialect_cannot_carry_is_refused_by_name(server: LoopbackServer, scripted: Any):
    client, _ = scripted()
    session = server.sessions.open(client, "policy", {})
    sdk = openai.AsyncOpenAI(base_url=server.base_url(session), api_key=session.id, max_retries=0)
    with pytest.raises(openai.BadRequestError, match="'tools\\[0\\]' is a 'web_search' tool"):
        await sdk.responses.create(model="any", input="hi", tools=[{"type": "web_search"}])
    with pytest.raises(openai.BadRequestError, match="not a response of this session"):
        await sdk.responses.create(model="any", input="hi", previous_response_id="resp_elsewhere")
    with pytest.raises(openai.BadRequestError, match="'input_image' part"):
        await sdk.responses.create(model="any", input=[{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}])
    claude = anthropic.AsyncAnthropic(base_url=server.session_root(session), api_key=session.id, max_retries=0)
    with pytest.raises(anthropic.BadRequestError, match="'image' block"):
        await claude.messages.create(model="any", max_tokens=8, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}])
    stranger = anthropic.AsyncAnthropic(base_url=f"{server.root}/s/nobody", api_key="k", max_retries=0)
    with pytest.raises(anthropic.NotFoundError, match="no session has this id"):
        await stranger.messages.create(model="any", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert not session.responses
