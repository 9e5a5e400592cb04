from __future__ import annotations

import time

import pytest

from bridges.environments import arithmetic
from bridges.environments.arithmetic import calculator, correct_answer, used_calculator


def test_splits_sizes_disjoint_and_deterministic() -> None:
    env = arithmetic.load_environment(num_train=60, num_eval=20, seed=5)
    train, evalset = env.get_dataset(), env.get_eval_dataset()
    assert (len(train), len(evalset)) == (60, 20)
    assert {"prompt", "answer", "example_id"} <= set(train.column_names)
    assert not set(train["question"]) & set(evalset["question"])
    again = arithmetic.load_environment(num_train=60, num_eval=20, seed=5).get_eval_dataset()
    assert again["question"] == evalset["question"]
    assert (
        arithmetic.load_environment(num_train=60, num_eval=20, seed=6).get_eval_dataset()["question"]
        != (evalset["question"])
    )


def test_answers_are_the_true_integer_values() -> None:
    for expression, value in arithmetic.make_problems(30, seed=0):
        terms = expression.split()
        assert 2 <= len(terms[::2]) <= 3
        assert value == int(calculator(expression))
    assert dict(arithmetic.make_problems(1, seed=0)) == {"99 - 55 * 7": -286}


def test_tool_schema_comes_from_the_signature_and_docstring() -> None:
    env = arithmetic.load_environment(num_train=1, num_eval=1)
    (schema,) = env.tool_defs
    assert schema["function"]["name"] == "calculator"
    assert schema["function"]["parameters"]["properties"]["expression"]["type"] == "string"
    assert schema["function"]["parameters"]["required"] == ["expression"]


@pytest.mark.parametrize(
    ("expression", "result"),
    [
        ("2 + 3 * 4", "14"),
        ("(2 + 3) * 4", "20"),
        ("-7 // 2", "-4"),
        ("7 % 3", "1"),
        ("7 / 2", "3.5"),
        ("6 / 3", "2"),
        ("2 ** 10", "1024"),
        ("1 / 3", "0.333333333333"),
        ("(" * 99 + "1" + ")" * 99, "1"),  # deep but within the length limit
        ("-" * 199 + "1", "-1"),
    ],
)
def test_calculator_evaluates_arithmetic(expression: str, result: str) -> None:
    assert calculator(expression) == result


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("__import__('os')", "Error: unsupported syntax 'Call'"),
        ("(1).real", "Error: unsupported syntax 'Attribute'"),
        ("x + 1", "Error: unsupported syntax 'Name'"),
        ("'a' * 3", "Error: unsupported syntax 'Constant'"),
        ("True + 1", "Error: unsupported syntax 'Constant'"),
        ("[1, 2]", "Error: unsupported syntax 'List'"),
        ("1 < 2", "Error: unsupported syntax 'Compare'"),
        ("1 +", "Error: cannot parse"),
        ("1 / 0", "Error: division by zero"),
        ("5 % 0", "Error: division by zero"),
        ("9 ** 9 ** 9", "Error: exponent too large"),
        ("10 ** 101", "Error: exponent too large"),
        ("(-8) ** 0.5", "Error: result is not a real number"),
        ("1" * 201, "Error: expression longer than 200 characters"),
        ("1e999 - 1", "Error: number too large"),
    ],
)
def test_calculator_rejects_unsafe_or_bad_input(expression: str, message: str) -> None:
    assert calculator(expression).startswith(message)


def test_calculator_accepts_a_number_argument() -> None:
    assert calculator(12) == "12"  # type: ignore[arg-type]  # a model may send a JSON number


def test_huge_exponent_is_rejected_quickly() -> None:
    started = time.perf_counter()
    assert calculator("99999 ** 99999").startswith("Error:")
    assert calculator("2 ** 64 ** 2").startswith("Error:")
    assert time.perf_counter() - started < 0.5


def test_correct_answer_reads_the_last_number_of_the_final_assistant_message() -> None:
    tool_turn = [
        {"role": "assistant", "content": "", "tool_calls": [{"id": "1", "type": "function"}]},
        {"role": "tool", "content": "-286", "tool_call_id": "1"},
    ]
    assert (
        correct_answer([*tool_turn, {"role": "assistant", "content": "So 99 - 55*7 = -286."}], "-286") == 1.0
    )
    assert correct_answer([{"role": "assistant", "content": "It is 1,234"}], "1234") == 1.0
    assert correct_answer([{"role": "assistant", "content": "-286 or maybe 286"}], "-286") == 0.0
    assert correct_answer([{"role": "assistant", "content": "no idea"}], "-286") == 0.0
    assert correct_answer(tool_turn, "-286") == 0.0  # the number only in a tool result does not count
    assert used_calculator(tool_turn) == 1.0
    assert used_calculator([{"role": "assistant", "content": "-286"}]) == 0.0


async def test_tool_call_is_answered_by_the_calculator() -> None:
    from bridges.envs.types import State

    env = arithmetic.load_environment(num_train=1, num_eval=1)
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "calculator", "arguments": '{"expression": "6*7"}'},
    }
    bad = {
        "id": "c2",
        "type": "function",
        "function": {"name": "calculator", "arguments": '{"expression": "1/0"}'},
    }
    state = State()
    await env.setup_state(state)
    reply = await env.env_response([{"role": "assistant", "content": "", "tool_calls": [call, bad]}], state)
    assert reply == [
        {"role": "tool", "content": "42", "tool_call_id": "c1"},
        {"role": "tool", "content": "Error: division by zero", "tool_call_id": "c2"},
    ]
    assert state.metrics == {"tool_calls": 2.0, "tool_errors": 1.0}


async def test_one_real_rollout(tiny_client, well_formed) -> None:
    env = arithmetic.load_environment(num_train=2, num_eval=2, max_turns=2)
    state = await env.rollout(env.get_eval_dataset()[0], tiny_client, "tiny", {"max_tokens": 12})
    await env.score_rollout(state)
    well_formed(state)
    assert state.stop_reason in {"completed", "max_turns"}
    if not state.errored:
        assert set(state.metrics) >= {"correct_answer", "used_calculator", "tool_calls", "tool_errors"}
