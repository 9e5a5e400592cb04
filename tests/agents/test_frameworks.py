"""Three real agent frameworks, unmodified, each calling a function tool through its rollout's session:
the OpenAI Agents SDK, pydantic-ai and LangChain. The scripted engine calls the offered tool, then
quotes its result, so every rollout is two calls; the turns are the engine's sampled ids, and each
framework re-sends its history so that the second call extends the first (one sample, no break).

What differs is what a fresh render of the framework's history would give (``drift_tokens``): the
Agents SDK and LangChain send the tool call's arguments back as the model wrote them (0); pydantic-ai
re-serialises them as compact JSON, which a re-render would tokenize differently — the ledger keeps
the sampled ids, so training sees none of it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from bridges import AgentEnv, Rubric
from bridges.workflows.samples import SampleStats, state_to_samples

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "agents" / "letter_agents.py"
CLI_AGENT = EXAMPLE.with_name("messages_cli_agent.py")


def example_agents() -> dict[str, Any]:
    """The agents of ``examples/agents/letter_agents.py``, as a user copies them."""
    spec = importlib.util.spec_from_file_location("letter_agents", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return dict(module.AGENTS)


AGENTS = example_agents()


def quoted_tool(state: Any, completion: list[dict[str, Any]]) -> float:
    """1 when the agent's final answer is what its tool returned (the script quotes it)."""
    returned = [m["content"] for m in completion if m["role"] == "tool"]
    return float(returned == [state["agent"].result] and len(returned[0]) == 6)


@pytest.mark.parametrize(("framework", "drift"), [("openai-agents", 0), ("pydantic-ai", 30), ("langchain", 0)])
async def test_a_framework_agent_with_a_tool_is_one_token_exact_sample(scripted: Any, framework: str, drift: int):
    client, engine = scripted()
    env = AgentEnv(AGENTS[framework], rubric=Rubric(funcs=[quoted_tool]))
    states = await env.run_group({"question": "Say b", "answer": "b"}, client, "policy", 2, {"max_tokens": 64})
    for state in states:
        assert state.stop_reason == "completed" and state.reward == 1.0, state.error
        first, second = state.turns
        assert first.message["tool_calls"][0]["function"]["name"] == "shout" and second.message["content"] == state["agent"].result
        stats = SampleStats()
        (sample,) = state_to_samples(state, 1.0, stats)
        assert stats.breaks == 0 and state.drift_tokens == drift
        assert sample.token_ids[: len(second.prompt_ids)] == second.prompt_ids
    assert sorted((tuple(t.prompt_ids), tuple(t.completion_ids)) for s in states for t in s.turns) == sorted(engine.calls)


async def test_a_command_line_agent_speaking_anthropic_messages_is_one_token_exact_sample(scripted: Any):
    """``examples/agents/messages_cli_agent.py`` as its own process, finding its model through
    ``ANTHROPIC_BASE_URL``: a tool_use / tool_result round trip, one sample, what it printed scored."""
    client, engine = scripted()

    def printed_tool(state: Any, completion: list[dict[str, Any]]) -> float:
        returned = [m["content"] for m in completion if m["role"] == "tool"]
        return float(returned == [state["agent"].output.strip()] and state["agent"].exit_code == 0)

    env = AgentEnv(command=[sys.executable, str(CLI_AGENT)], rubric=Rubric(funcs=[printed_tool]))
    states = await env.run_group({"question": "Say b", "answer": "b"}, client, "policy", 2, {"max_tokens": 64})
    for state in states:
        assert state.stop_reason == "completed" and state.reward == 1.0, (state.error, state["agent"].output)
        stats = SampleStats()
        state_to_samples(state, 1.0, stats)
        assert len(state.turns) == 2 and stats.samples == 1 and stats.breaks == 0 and state.drift_tokens == 0
    assert sorted((tuple(t.prompt_ids), tuple(t.completion_ids)) for s in states for t in s.turns) == sorted(engine.calls)
