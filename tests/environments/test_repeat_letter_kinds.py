"""The default task as a multi-turn environment (``repeat_letter_turns``) and as a tool task
(``repeat_letter_tool``): exact rewards, and scripted rollouts through the real client and the tiny
chat template — the feedback between turns, the early stop, the tool reached by any call."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from scripted_engine import ScriptedEngine

from bridges.environments import repeat_letter_tool, repeat_letter_turns


def replies(*texts: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for text in texts:
        out += [{"role": "assistant", "content": text}, {"role": "user", "content": "x/6"}]
    return out[:-1]


def letter_of(prompt: str) -> str:
    return prompt.split("<|im_start|>user\n", 1)[1][:1]


def test_the_turns_reward_is_the_mean_over_turns_with_unplayed_turns_of_a_solved_episode_right() -> None:
    reward = repeat_letter_turns.make_turns_reward(3, 6)
    assert reward(replies("aaaaaa"), "a") == 1.0  # solved at once: the two turns it did not need count
    assert reward(replies("aaa", "aaaaaa"), "a") == pytest.approx((0.5 + 1 + 1) / 3)
    assert reward(replies("xxxxxx", "xxxxxx", "aaa"), "a") == pytest.approx(0.5 / 3)
    assert reward(replies("aaaaa", "aaaaa", "aaaaa"), "a") == pytest.approx(5 / 6)  # never solved: no bonus
    assert reward([], "a") == 0.0
    with pytest.raises(ValueError, match="turns"):
        repeat_letter_turns.load_environment(turns=0)
    with pytest.raises(ValueError, match="distinct"):
        repeat_letter_turns.load_environment(alphabet="aab")


def test_the_tool_reward_is_half_for_calling_first_and_half_for_the_final_reply() -> None:
    reward = repeat_letter_tool.make_tool_reward(6)
    call = {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "function": {"name": "", "arguments": ""}}]}
    tool = {"role": "tool", "content": "a", "tool_call_id": "c"}
    assert reward([call, tool, {"role": "assistant", "content": "aaaaaa"}], "a") == 1.0
    assert reward([call, tool, {"role": "assistant", "content": "aaa"}], "a") == 0.75
    assert reward([{"role": "assistant", "content": "aaaaaa"}], "a") == 0.5  # answered without the tool
    assert reward([call, tool, {**call, "content": "aa"}], "a") == pytest.approx(0.5 + 0.5 * 2 / 6)
    assert reward([], "a") == 0.0
    with pytest.raises(ValueError, match="max_turns"):
        repeat_letter_tool.load_environment(max_turns=1)
    with pytest.raises(ValueError, match="length"):
        repeat_letter_tool.load_environment(length=0)


async def _rollout(env: Any, tiny_tokenizer: Any, script: Callable[[str], str]) -> tuple[Any, ScriptedEngine]:
    from bridges.client import EngineClient

    engine = ScriptedEngine(tiny_tokenizer, script)
    state = await env.rollout(env.get_eval_dataset()[2], EngineClient(engine, model_name="tiny"), "tiny")
    await env.score_rollout(state)
    return state, engine


async def test_a_turns_episode_gets_feedback_after_each_reply_and_stops_once_solved(tiny_tokenizer: Any) -> None:
    env = repeat_letter_turns.load_environment()

    def improving(prompt: str) -> str:  # half right, then right in full
        return letter_of(prompt) * (6 if "3/6" in prompt else 3)

    state, engine = await _rollout(env, tiny_tokenizer, improving)
    assert [m["content"] for m in state.completion] == ["ccc", "3/6", "cccccc"]
    assert state.stop_reason == "solved" and state.reward == pytest.approx((0.5 + 1 + 1) / 3)
    assert len(engine.calls) == 2 and all(len(ids) <= 6 for _, ids in engine.calls)  # per-turn max_tokens
    first_prompt, first_ids = engine.calls[0]
    assert engine.calls[1][0][: len(first_prompt) + len(first_ids)] == first_prompt + first_ids  # one ledger

    state, engine = await _rollout(env, tiny_tokenizer, lambda prompt: "xx")
    assert [m["content"] for m in state.completion] == ["xx", "0/6", "xx", "0/6", "xx"]
    assert state.stop_reason == "max_turns" and state.reward == 0.0


async def test_any_tool_call_reaches_the_one_tool_which_answers_with_the_letter(tiny_tokenizer: Any) -> None:
    env = repeat_letter_tool.load_environment()
    assert [d["function"]["name"] for d in env.tool_defs] == ["letter"]

    def call_then_quote(prompt: str) -> str:  # a garbled call (no JSON, no name), then the tool's answer
        if "<tool_response>" in prompt:
            return prompt.rsplit("<tool_response>\n", 1)[1][:1] * 6
        return "<tool_call>#!"

    state, engine = await _rollout(env, tiny_tokenizer, call_then_quote)
    assert "<tools>" in tiny_tokenizer.decode(engine.calls[0][0])  # the tool is offered in the prompt
    assert [m["role"] for m in state.completion] == ["assistant", "tool", "assistant"]
    assert state.completion[1]["content"] == "c" and state.completion[2]["content"] == "cccccc"
    assert state.metrics["tool_calls"] == 1.0 and state.reward == 1.0 and state.stop_reason == "completed"

    state, _ = await _rollout(env, tiny_tokenizer, lambda prompt: letter_of(prompt) * 6)
    assert state.reward == 0.5 and len(state.completion) == 1 and state.metrics["tool_calls"] == 0.0
