"""``AgentEnv``: an agent's session calls are the rollout, token for token; how the agent ended reaches the
rubric; every way an agent can fail masks only its own rollout, with one sentence, and leaves no
process behind."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import openai
import pytest

from bridges import AgentEnv, ConfigError, Rubric
from bridges.workflows.samples import SampleStats, state_to_samples

ROW = {"question": "Say b", "answer": "b"}


def final_reward(state: Any) -> float:
    return 1.0 if state["agent"].error is None else 0.0


async def two_calls(base_url: str, api_key: str, row: dict[str, Any]) -> str:
    async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        messages = list(row["prompt"])
        for _ in range(2):
            reply = (await client.chat.completions.create(model="any", messages=messages)).choices[0].message
            messages += [{"role": "assistant", "content": reply.content}, {"role": "user", "content": "Again."}]
        return reply.content or ""


async def run(env: AgentEnv, client: Any, n: int = 1, args: dict[str, Any] | None = None) -> list[Any]:
    return await env.run_group(ROW, client, "policy", n, args or {"max_tokens": 16})


async def test_the_agents_calls_are_the_rollout_and_the_rubric_sees_its_result(scripted: Any):
    client, engine = scripted()

    def reward(state: Any) -> float:
        return float(len(state["agent"].result))

    env = AgentEnv(two_calls, rubric=Rubric(funcs=[reward]))
    (state,) = await run(env, client)
    assert state.stop_reason == "completed" and state.error is None
    assert env._servers._by_loop == {}  # the loop's server closed with its last rollout, and is forgotten
    assert [(tuple(t.prompt_ids), tuple(t.completion_ids)) for t in state.turns] == engine.calls
    assert state.reward == len(state["agent"].result) == 6  # "bbbbbb" or the like: the script's reply
    assert [m["role"] for m in state.completion] == ["assistant", "user", "assistant"]
    stats = SampleStats()
    (sample,) = state_to_samples(state, 1.0, stats)
    assert stats.breaks == 0 and state.drift_tokens == 0
    assert sum(sample.loss_mask) == sum(len(t.completion_ids) for t in state.turns)


async def test_a_side_conversation_is_a_second_sample_of_the_rollout_and_a_counted_break(scripted: Any):
    """The branch rule: a call that does not extend the one before starts a new sample, same advantage."""
    client, _ = scripted()

    async def two_threads(base_url: str, api_key: str, row: dict[str, Any]) -> str:
        answer = await two_calls(base_url, api_key, row)
        async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as sdk:
            await sdk.chat.completions.create(model="any", messages=[{"role": "user", "content": "Say c"}])
        return answer

    (state,) = await run(AgentEnv(two_threads), client)
    stats = SampleStats()
    samples = state_to_samples(state, 0.5, stats)
    assert len(state.turns) == 3 and (stats.samples, stats.breaks) == (2, 1)
    assert [s.advantage for s in samples] == [0.5, 0.5] and samples[1].token_ids == state.turns[2].prompt_ids + state.turns[2].completion_ids


COMMAND_AGENT = textwrap.dedent("""
    import json, os, sys
    from openai import OpenAI
    row = json.load(sys.stdin)
    client = OpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ["OPENAI_API_KEY"])
    reply = client.chat.completions.create(model="any", messages=[{"role": "user", "content": sys.argv[1]}])
    print("answer:", reply.choices[0].message.content, row["answer"], os.environ["ANTHROPIC_BASE_URL"][-4:])
""")


async def test_a_command_reaches_its_session_through_the_environment_and_gets_its_row_on_stdin(scripted: Any):
    client, engine = scripted()

    def reward(state: Any) -> float:
        return float(state["agent"].exit_code == 0 and "answer:" in state["agent"].output)

    env = AgentEnv(command=[sys.executable, "-c", COMMAND_AGENT, "{prompt}"], rubric=Rubric(funcs=[reward]))
    (state,) = await run(env, client)
    assert state.stop_reason == "completed" and state.reward == 1.0, state.error
    outcome = state["agent"]
    assert outcome.output.split()[-2:] == ["b", outcome.output.split()[-1]] and "/v1" not in outcome.output[-5:]
    assert engine.calls and "Say b" in client.engine.tokenizer.decode(engine.calls[0][0])


async def agent_that_raises(base_url: str, api_key: str, row: dict[str, Any]) -> None:
    raise RuntimeError("my tool server is down")


async def agent_that_hangs(base_url: str, api_key: str, row: dict[str, Any]) -> None:
    await two_calls(base_url, api_key, row)
    await asyncio.sleep(3600)


async def agent_that_never_calls(base_url: str, api_key: str, row: dict[str, Any]) -> str:
    return "I know this one."


async def agent_that_floods(base_url: str, api_key: str, row: dict[str, Any]) -> None:
    async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        while True:
            await client.chat.completions.create(model="any", messages=row["prompt"])


LATE: list[Any] = []


async def agent_that_calls_late(base_url: str, api_key: str, row: dict[str, Any]) -> str:
    """The first of a group leaves a task that calls its session again after it returned; the second
    keeps the server up meanwhile (with none left, a late call finds no server: a connection error)."""
    if LATE:
        await asyncio.sleep(1.0)
        return await two_calls(base_url, api_key, row)

    async def later() -> None:
        await asyncio.sleep(0.3)
        try:
            await two_calls(base_url, api_key, row)
        except openai.APIStatusError as exc:
            LATE.append(exc.status_code)

    LATE.append(asyncio.ensure_future(later()))
    return await two_calls(base_url, api_key, row)


@pytest.mark.parametrize(
    ("agent", "stop", "sentence"),
    [
        (agent_that_raises, "env_error", "the agent raised RuntimeError: my tool server is down"),
        (agent_that_hangs, "timeout", "the agent did not finish within agent_timeout=1.0 s."),
        (agent_that_never_calls, "env_error", "the agent finished without calling the model"),
        (agent_that_floods, "env_error", "the agent made more than 5 model calls (max_calls)."),
    ],
    ids=["raises", "hangs", "never-calls", "floods"],
)
async def test_a_failing_agent_masks_only_its_rollout_with_one_sentence(
    scripted: Any, agent: Any, stop: str, sentence: str
):
    client, _ = scripted()
    env = AgentEnv(agent, agent_timeout=1.0, max_calls=5, rubric=Rubric(funcs=[final_reward]))
    started = time.monotonic()
    (state,) = await run(env, client)
    assert time.monotonic() - started < 30
    assert state.stop_reason == stop and state.error.startswith(sentence), state.error
    assert state.errored and not state.trainable


async def test_a_call_after_the_rollout_ended_is_refused_and_changes_nothing(scripted: Any):
    client, _ = scripted()
    LATE.clear()
    states = await run(AgentEnv(agent_that_calls_late), client, n=2)
    await LATE[0]
    assert LATE[1:] == [410]
    assert [(s.stop_reason, len(s.turns)) for s in states] == [("completed", 2), ("completed", 2)]


async def test_one_agent_failing_leaves_the_rest_of_its_group_alone(scripted: Any):
    client, _ = scripted()
    seen: list[int] = []

    async def sometimes(base_url: str, api_key: str, row: dict[str, Any]) -> str:
        seen.append(len(seen))
        if len(seen) == 2:
            raise ValueError("unlucky")
        return await two_calls(base_url, api_key, row)

    states = await run(AgentEnv(sometimes, rubric=Rubric(funcs=[final_reward])), client, n=3)
    assert [s.stop_reason for s in states].count("completed") == 2
    assert [s.error for s in states if s.errored] == ["the agent raised ValueError: unlucky"]


def _processes_with(marker: str, wait_s: float = 5.0) -> list[int]:
    """The host's processes whose command line holds ``marker`` (after up to ``wait_s`` for the kill to land)."""
    deadline = time.monotonic() + wait_s
    while True:
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError):
                    if marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                        found.append(int(entry))
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


async def test_a_command_that_hangs_or_fails_is_killed_with_everything_it_started(scripted: Any, tmp_path: Path):
    client, _ = scripted()
    marker = f"agent-marker-{tmp_path.name}"  # the agent runs in a PID namespace: its own pids mean nothing here
    sleeper = f"{sys.executable} -c 'import time; time.sleep(300)' {marker}"
    hang = f"{sleeper} & {sleeper}"
    env = AgentEnv(command=["sh", "-c", hang], agent_timeout=1.0)
    (state,) = await run(env, client)
    assert state.stop_reason == "timeout" and "its processes were killed" in state.error
    assert _processes_with(marker) == []  # both sleepers (and the shell) are gone

    flood = "yes 'a very long line of output' | head -c 20000000; echo; echo last words; exit 3"
    (state,) = await run(AgentEnv(command=["sh", "-c", flood]), client)
    assert state.error == "the agent exited with code 3: last words" and state["agent"].exit_code == 3
    assert len(state["agent"].output) <= 16 * 1024  # a flood of output keeps only its tail

    (state,) = await run(AgentEnv(command=["/no/such/agent"]), client)
    assert state.error.startswith("the agent command '/no/such/agent' could not start")


def test_a_misconfigured_agent_env_is_one_sentence():
    def sync_agent(base_url: str, api_key: str, row: dict[str, Any]) -> str:
        return ""

    cases = [
        ({}, "exactly one of agent="),
        ({"agent": two_calls, "command": "x"}, "exactly one of agent="),
        ({"agent": sync_agent}, "must be an async function"),
        ({"command": ""}, "names no program"),
        ({"agent": two_calls, "agent_timeout": 0}, "agent_timeout must be a positive"),
        ({"agent": two_calls, "max_calls": 0}, "at least 1"),
    ]
    for kwargs, sentence in cases:
        with pytest.raises(ConfigError, match=sentence):
            AgentEnv(**kwargs)
