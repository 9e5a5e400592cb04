"""Attack: a reply whose tool call names no tool, or one the request never offered (issue 40, item 7).

Before: a malformed ``<tool_call>`` became a call named "" under ``tool_choice=auto``, and after the
forced call under ``required`` with two tools (the OpenAI Agents SDK then raised "Tool  not found").
Now no reply an agent gets from a session carries a call whose name is empty or undeclared; a reply
left with no call is its text. An environment calling the client itself still sees such a call, as
vLLM serves it, and answers it with an error (``test_rollout_faults``); ``extra_body=
{"declared_tools_only": true}`` asks for the agents' behaviour anywhere."""

from __future__ import annotations

from typing import Any

import pytest

TOOLS = [{"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}
         for name in ("lookup", "search")]
ASK = [{"role": "user", "content": "Find it."}]

REPLIES = {  # (tool_choice, what the model writes after the prompt and any prefilled opener)
    "auto, a broken block": ("auto", '<tool_call>\n{"nam: lookup, "arguments": {}\n</tool_call>'),
    "auto, an undeclared name": ("auto", '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>'),
    "auto, an empty name": ("auto", '<tool_call>\n{"name": "", "arguments": {}}\n</tool_call>'),
    "required, a good call then a broken one": (
        "required", 'lookup", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": '),
}


@pytest.mark.parametrize("case", sorted(REPLIES))
async def test_no_reply_to_an_agent_carries_a_call_to_an_empty_or_undeclared_name(scripted: Any, case: str):
    from bridges.agents.sessions import Sessions, answer_chat
    from bridges.client.http_bodies import response_json

    tool_choice, reply = REPLIES[case]
    client, engine = scripted(lambda prompt: reply)
    session = Sessions().open(client, "m", {"max_tokens": 64})  # what every agent surface answers through
    status, _, response = await answer_chat(session, {"messages": ASK, "tools": TOOLS, "tool_choice": tool_choice})
    choice = response_json(response)["choices"][0]
    names = [call["function"]["name"] for call in choice["message"].get("tool_calls") or []]
    assert status == 200 and all(name in ("lookup", "search") for name in names), names
    if tool_choice == "auto":  # nothing callable: the model's own text, as it wrote it
        assert names == [] and choice["message"]["content"] == reply and choice["finish_reason"] == "stop"
    else:  # a reply with a call to no name is drawn again, then the engine names a declared tool itself
        assert len(names) == 1 and choice["finish_reason"] == "tool_calls"
    assert engine.calls  # the engine really sampled the reply


async def test_an_environment_still_sees_the_call_and_may_ask_for_declared_ones_only(scripted: Any):
    client, _ = scripted(lambda prompt: REPLIES["auto, an undeclared name"][1])
    plain = await client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, max_tokens=64)
    asked = await client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, max_tokens=64,
                                                 extra_body={"declared_tools_only": True})
    assert [c.function.name for c in plain.choices[0].message.tool_calls or []] == ["rm_rf"]
    assert asked.choices[0].message.tool_calls is None and "rm_rf" in (asked.choices[0].message.content or "")
