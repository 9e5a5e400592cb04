"""Rollout records: JSON-safe, one Arrow schema across kinds of rollouts, and a lossless way back.

The records feed JSONL files, ``datasets.Dataset`` tables and offline re-scoring, so the checks are
round trips through each of those, over single-turn, multi-turn, tool-calling and errored rollouts
mixed in one table, plus states produced by real rollouts over the openai SDK.
"""

from __future__ import annotations

import json
import math

import pytest
from core_fakes import ChatServer, completion, tool_call
from datasets import Dataset

from bridges.envs.results import record_to_state, state_to_record
from bridges.envs.rubric import Rubric
from bridges.envs.tool import ToolEnv
from bridges.envs.types import State, Timing, Turn

SYSTEM = {"role": "system", "content": "be brief"}


def single_turn() -> State:
    return State(
        example_id=0,
        task="math",
        prompt=[SYSTEM, {"role": "user", "content": "2+2?"}],
        completion=[{"role": "assistant", "content": "4", "reasoning_content": "add them"}],
        answer="4",
        info={"difficulty": 1, "tags": ["easy"], "nested": {"a": [1, 2]}},
        row={"question": "2+2?", "source": "gsm"},
        turns=[
            Turn(
                prompt_ids=[1, 2, 3],
                completion_ids=[7, 2],
                logprobs=[-0.25, -0.5],
                finish_reason="stop",
                weight_version=3,
                message={"role": "assistant", "content": "4", "reasoning_content": "add them"},
            )
        ],
        reward=1.0,
        metrics={"correct": 1.0, "num_turns": 1.0},
        stop_reason="completed",
        timing=Timing(generation_s=0.5, scoring_s=0.25, total_s=0.75),
        drift_tokens=0,
        drifted_turns=0,
    )


def multi_turn() -> State:
    return State(
        example_id=1,
        prompt=[{"role": "user", "content": "guess 1..9"}],
        completion=[
            {"role": "assistant", "content": "5"},
            {"role": "user", "content": "lower"},
            {"role": "assistant", "content": "3"},
        ],
        answer="3",
        turns=[
            Turn(prompt_ids=[1], completion_ids=[5, 2], logprobs=[-1.0, -0.125], finish_reason="stop"),
            Turn(
                prompt_ids=[1, 5, 2, 9], completion_ids=[3, 2], logprobs=[-0.5, -0.0625], finish_reason="stop"
            ),
        ],
        reward=0.5,
        metrics={"num_turns": 2.0, "guesses": 2.0},
        stop_reason="solved",
        drift_tokens=2,
        drifted_turns=1,
        extras={"secret": 3, "history": [5, 3]},
    )


def tool_calling() -> State:
    call = tool_call("add", '{"a": 1, "b": 2}', "call_7")
    return State(
        example_id=2,
        prompt=[{"role": "user", "content": "add 1 and 2"}],
        completion=[
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "content": "3", "tool_call_id": "call_7", "name": "add"},
            {"role": "assistant", "content": "3"},
        ],
        answer="3",
        turns=[
            Turn(
                completion_ids=[],
                finish_reason="tool_calls",
                message={"role": "assistant", "content": None, "tool_calls": [call]},
            ),
            Turn(finish_reason="stop", message={"role": "assistant", "content": "3"}),
        ],
        reward=1.0,
        metrics={"num_turns": 2.0, "tool_calls": 1.0, "tool_errors": 0.0},
        stop_reason="completed",
    )


def errored() -> State:
    return State(
        example_id=3,
        prompt=[{"role": "user", "content": "x"}],
        reward=None,
        stop_reason="engine_error",
        error="the model call failed after 3 attempts (InternalServerError: down).",
        metrics={"num_turns": 0.0},
    )


def all_states() -> list[State]:
    return [single_turn(), multi_turn(), tool_calling(), errored()]


@pytest.mark.parametrize("make", [single_turn, multi_turn, tool_calling, errored])
def test_record_is_strict_json_and_round_trips(make):
    state = make()
    record = state_to_record(state)
    text = json.dumps(record, allow_nan=False)  # strict JSON: no NaN, no objects
    assert record_to_state(json.loads(text)) == state
    assert record_to_state(record) == state


def test_message_records_share_one_key_set():
    keys = {
        tuple(message)
        for state in all_states()
        for record in [state_to_record(state)]
        for message in [*record["prompt"], *record["completion"]]
    }
    assert keys == {("role", "content", "tool_calls", "tool_call_id", "name", "reasoning_content")}


def test_mixed_rollouts_make_one_dataset_and_come_back_unchanged():
    states = all_states()
    dataset = Dataset.from_list([state_to_record(s) for s in states])
    assert len(dataset) == len(states)
    assert dataset["reward"] == [1.0, 0.5, 1.0, None]
    assert dataset["stop_reason"] == ["completed", "solved", "completed", "engine_error"]
    back = [record_to_state(row) for row in dataset]
    assert back == states
    # token ids and logprobs survive Arrow exactly, turn by turn
    assert [t["completion_ids"] for t in dataset[1]["turns"]] == [[5, 2], [3, 2]]
    assert dataset[0]["turns"][0]["logprobs"] == [-0.25, -0.5]


def test_non_json_values_become_json_and_nan_reward_becomes_none():
    state = single_turn()
    state.reward = math.nan
    state.info = {"when": {1, 2}}
    state.extras = {"obj": object(), "tuple": (1, 2)}
    record = state_to_record(state)
    json.dumps(record, allow_nan=False)
    assert record["reward"] is None
    back = record_to_state(record)
    assert back.info == {"when": [1, 2]}
    assert back.extras["tuple"] == [1, 2] and back.extras["obj"].startswith("<object object")


def test_record_keeps_the_error_sentence_and_errored_flag():
    back = record_to_state(json.loads(json.dumps(state_to_record(errored()))))
    assert back.errored and back.reward is None
    assert back.error == "the model call failed after 3 attempts (InternalServerError: down)."


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: first
        b: second
    """
    return a + b


def final_answer(completion: list[dict], answer: str) -> float:
    return 1.0 if completion[-1]["content"] == answer else 0.0


async def test_states_from_real_rollouts_round_trip_through_a_dataset():
    """Tool-calling rollouts over the real SDK, with token extras, exported and read back."""

    def respond(body: dict, index: int) -> dict:
        has_tool_reply = body["messages"][-1]["role"] == "tool"
        question = body["messages"][1]["content"]
        if not has_tool_reply:
            args = '{"a": 2, "b": 3}' if "2" in question else '{"a": 1,'  # the second row sends bad JSON
            return completion(
                None,
                tool_calls=[tool_call("add", args, f"call_{index}")],
                finish_reason="tool_calls",
                prompt_token_ids=list(range(10)),
                token_ids=[20, 21, 2],
                token_logprobs=[-0.5, -0.25, -0.125],
                weight_version=4,
            )
        return completion(
            body["messages"][-1]["content"],
            prompt_token_ids=list(range(16)),
            token_ids=[30, 2],
            token_logprobs=[-1.0, -0.0625],
            weight_version=4,
        )

    server = ChatServer(respond)
    rows = Dataset.from_dict({"question": ["add 2 and 3", "add 1 and 1"], "answer": ["5", "2"]})
    env = ToolEnv(
        tools=[add], dataset=rows, system_prompt="use tools", rubric=Rubric([final_answer]), max_retries=0
    )
    result = await env.generate(
        env.get_dataset(), server.client(), "m", rollouts_per_example=2, progress=False
    )
    assert len(result.states) == 4
    ok, bad = result.states[0], result.states[2]
    assert ok.reward == 1.0 and ok.completion[1] == {"role": "tool", "content": "5", "tool_call_id": "call_0"}
    assert bad.completion[1]["content"].startswith("Error:") and bad.reward == 0.0
    assert ok.turns[0].completion_ids == [20, 21, 2] and ok.turns[1].prompt_ids == list(range(16))

    dataset = result.to_dataset()
    assert len(dataset) == len(result.states)
    assert [record_to_state(row) for row in dataset] == result.states
    with_json = [record_to_state(json.loads(json.dumps(r, allow_nan=False))) for r in result.to_records()]
    assert with_json == result.states
