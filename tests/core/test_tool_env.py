"""ToolEnv: tool results and every tool failure go back to the model as tool messages, counted in metrics."""

from __future__ import annotations

import asyncio
import json

from core_fakes import ChatServer, completion, tool_call

from bridges.envs import ToolEnv
from bridges.envs.rubric import Rubric

ROW = {"question": "What is 6*7?", "answer": "42"}


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: first factor
        b: second factor
    """
    return a * b


async def lookup(key: str) -> dict:
    """Look a key up."""
    await asyncio.sleep(0)
    return {"key": key, "value": 1}


def explode(x: int) -> int:
    """Always fails."""
    raise ValueError(f"cannot handle {x}")


def hang() -> str:
    """Never returns in time."""
    import time

    time.sleep(0.25)
    return "late"


def scripted(*replies):
    """Each model turn returns the next scripted reply (a list of tool calls, or final text)."""

    def respond(body, i):
        reply = replies[i]
        if isinstance(reply, str):
            return completion(reply)
        return completion(None, tool_calls=reply, finish_reason="tool_calls")

    return ChatServer(respond)


def env(**kw):
    rubric = Rubric([lambda completion, answer: float(answer in (completion[-1]["content"] or ""))])
    return ToolEnv([multiply, lookup, explode, hang], rubric=rubric, tool_timeout=0.1, **kw)


async def test_tool_success_sync_and_async_then_answer():
    server = scripted(
        [tool_call("multiply", '{"a": 6, "b": 7}', "c1"), tool_call("lookup", '{"key": "k"}', "c2")],
        "The answer is 42.",
    )
    e = env()
    (state,) = await e.run_group(ROW, server.client(), "m", 1)
    assert state.stop_reason == "completed" and state.error is None and state.reward == 1.0
    first = server.requests[0]
    assert [t["function"]["name"] for t in first["tools"]] == ["multiply", "lookup", "explode", "hang"]
    assert first["tools"][0]["function"]["parameters"]["properties"]["a"] == {
        "type": "integer",
        "description": "first factor",
    }
    tool_msgs = [m for m in state.completion if m["role"] == "tool"]
    assert tool_msgs == [
        {"role": "tool", "content": "42", "tool_call_id": "c1"},
        {"role": "tool", "content": json.dumps({"key": "k", "value": 1}), "tool_call_id": "c2"},
    ]
    # the second request carried the assistant tool-call message (content None) and both results
    second = server.requests[1]["messages"]
    assert (
        second[-3]["role"] == "assistant"
        and second[-3]["content"] is None
        and len(second[-3]["tool_calls"]) == 2
    )
    assert state.metrics["tool_calls"] == 2.0 and state.metrics["tool_errors"] == 0.0
    assert state.metrics["num_turns"] == 2.0


async def test_every_tool_failure_is_a_tool_message_and_counted():
    server = scripted(
        [
            tool_call("explode", '{"x": 3}', "e1"),
            tool_call("nope", "{}", "e2"),
            tool_call("multiply", '{"a": 6, "b": ', "e3"),
            tool_call("multiply", '{"a": 6, "c": 7}', "e4"),
            tool_call("multiply", "[1, 2]", "e5"),
            tool_call("hang", "{}", "e6"),
        ],
        "sorry",
    )
    (state,) = await env().run_group(ROW, server.client(), "m", 1)
    assert state.error is None and state.stop_reason == "completed"
    contents = {m["tool_call_id"]: m["content"] for m in state.completion if m["role"] == "tool"}
    assert contents["e1"] == "Error: the tool 'explode' raised ValueError: cannot handle 3"
    assert (
        contents["e2"]
        == "Error: there is no tool named 'nope'; available tools: explode, hang, lookup, multiply."
    )
    assert contents["e3"].startswith("Error: the arguments for 'multiply' are not valid JSON (")
    assert contents["e4"].startswith("Error: wrong arguments for 'multiply': ")
    assert contents["e5"] == "Error: the arguments for 'multiply' must be a JSON object, got list."
    assert contents["e6"] == "Error: the tool 'hang' did not finish within 0.1 s."
    assert state.metrics["tool_calls"] == 6.0 and state.metrics["tool_errors"] == 6.0
    assert state.reward == 0.0


async def test_tool_env_stops_at_max_turns_when_model_keeps_calling():
    server = ChatServer(
        lambda body, i: completion(None, tool_calls=[tool_call("multiply", '{"a": 1, "b": 2}', f"c{i}")])
    )
    (state,) = await env(max_turns=3).run_group(ROW, server.client(), "m", 1)
    assert state.stop_reason == "max_turns" and len(server.requests) == 3
    # the third turn's call is not run: max_turns fires before env_response, no model turn would read it
    assert state.metrics["tool_calls"] == 2.0 and state.completion[-1]["role"] == "assistant"
