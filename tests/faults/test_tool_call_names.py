"""Attack: a reply whose tool call names no tool, or one the request never offered (issue 40, item 7).

Before: a malformed ``<tool_call>`` became a call named "" under ``tool_choice=auto``, and after the
forced call under ``required`` with two tools (the OpenAI Agents SDK then raised "Tool  not found").
Now no reply carries a call whose name is empty or undeclared; a reply left with no call is its text."""

from __future__ import annotations

from typing import Any

import pytest

TOOLS = [{"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}
         for name in ("lookup", "search")]  # fmt: skip
ASK = [{"role": "user", "content": "Find it."}]

REPLIES = {  # (tool_choice, what the model writes after the prompt and any prefilled opener)
    "auto, a broken block": ("auto", '<tool_call>\n{"nam: lookup, "arguments": {}\n</tool_call>'),
    "auto, an undeclared name": ("auto", '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>'),
    "auto, an empty name": ("auto", '<tool_call>\n{"name": "", "arguments": {}}\n</tool_call>'),
    "required, a good call then a broken one": (
        "required", 'lookup", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": '),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(REPLIES))
async def test_no_reply_carries_a_call_to_an_empty_or_undeclared_name(scripted: Any, case: str):
    tool_choice, reply = REPLIES[case]
    client, engine = scripted(lambda prompt: reply)
    response = await client.chat.completions.create(
        model="m", messages=ASK, tools=TOOLS, tool_choice=tool_choice, max_tokens=64
    )
    message = response.choices[0].message
    names = [call.function.name for call in message.tool_calls or []]
    assert all(name in ("lookup", "search") for name in names), names
    if tool_choice == "auto":  # nothing callable: the model's own text, as it wrote it
        assert names == [] and message.content == reply and response.choices[0].finish_reason == "stop"
    else:
        assert names == ["lookup"] and response.choices[0].finish_reason == "tool_calls"
    assert engine.calls  # the engine really sampled the reply
