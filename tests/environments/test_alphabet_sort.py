from __future__ import annotations

import pytest

from bridges.environments import alphabet_sort
from bridges.environments.alphabet_sort import (
    expected_lists,
    list_similarity,
    parse_names,
    per_turn_similarity,
)
from bridges.envs.types import State

ROUNDS = [["Nora", "Ada", "Theo"], ["Bruno"], ["Zoe", "Clara"]]


def test_splits_sizes_disjoint_and_deterministic() -> None:
    env = alphabet_sort.load_environment(num_train=40, num_eval=10, seed=4)
    train, evalset = env.get_dataset(), env.get_eval_dataset()
    assert (len(train), len(evalset)) == (40, 10)
    as_key = lambda row: str(row["info"]["rounds"])  # noqa: E731
    assert not {as_key(r) for r in train} & {as_key(r) for r in evalset}
    for row in evalset:
        rounds = row["info"]["rounds"]
        assert 2 <= len(rounds) <= 3 and 3 <= len(rounds[0]) <= 5
        names = [n for r in rounds for n in r]
        assert len(names) == len(set(names))
        assert row["answer"] == "\n".join(sorted(names))
    again = alphabet_sort.load_environment(num_train=40, num_eval=10, seed=4).get_eval_dataset()
    assert again["info"] == evalset["info"]


def test_expected_lists_grow_and_stay_sorted() -> None:
    assert expected_lists(ROUNDS) == [
        ["Ada", "Nora", "Theo"],
        ["Ada", "Bruno", "Nora", "Theo"],
        ["Ada", "Bruno", "Clara", "Nora", "Theo", "Zoe"],
    ]


def test_parse_names_accepts_lines_commas_bullets_and_numbers() -> None:
    assert parse_names("Ada\nNora\nTheo") == ["Ada", "Nora", "Theo"]
    assert parse_names("Ada, Nora,Theo") == ["Ada", "Nora", "Theo"]
    assert parse_names("1. Ada\n2) Nora\n- Theo\n\n") == ["Ada", "Nora", "Theo"]
    assert parse_names(None) == []


def test_per_turn_similarity_exact_numbers() -> None:
    def convo(*answers: str) -> list[dict[str, str]]:
        out: list[dict[str, str]] = []
        for text in answers:
            out += [{"role": "assistant", "content": text}, {"role": "user", "content": "Now also add ..."}]
        return out[:-1]

    info = {"rounds": ROUNDS}
    right = ["Ada\nNora\nTheo", "Ada\nBruno\nNora\nTheo", "Ada\nBruno\nClara\nNora\nTheo\nZoe"]
    assert per_turn_similarity(convo(*right), info) == 1.0
    # round 1 unsorted (Nora, Ada, Theo vs Ada, Nora, Theo: 2 of 3 match -> 4/6), rounds 2-3 right
    assert per_turn_similarity(convo("Nora, Ada, Theo", *right[1:]), info) == pytest.approx((4 / 6 + 2) / 3)
    # only the first round answered: the two missing rounds score 0
    assert per_turn_similarity(convo("Ada, Nora, Theo"), info) == pytest.approx(1 / 3)
    assert list_similarity(["Ada", "Bruno"], ["Ada", "Bruno", "Nora", "Theo"]) == pytest.approx(4 / 6)


async def test_env_response_reveals_the_next_round_and_records_answers() -> None:
    env = alphabet_sort.load_environment(num_train=1, num_eval=1)
    state = State(info={"rounds": ROUNDS})
    await env.setup_state(state)
    assert state["expected"] == expected_lists(ROUNDS)
    (msg,) = await env.env_response([{"role": "assistant", "content": "Ada\nNora\nTheo"}], state)
    assert msg["role"] == "user" and msg["content"].startswith("Now also add: Bruno.")
    (msg,) = await env.env_response([{"role": "assistant", "content": "Ada, Bruno"}], state)
    assert msg["content"].startswith("Now also add: Zoe, Clara.")
    assert state["answers"] == [["Ada", "Nora", "Theo"], ["Ada", "Bruno"]]


async def test_one_real_rollout(tiny_client, well_formed) -> None:
    env = alphabet_sort.load_environment(num_train=2, num_eval=2)
    row = env.get_eval_dataset()[0]
    state = await env.rollout(row, tiny_client, "tiny", {"max_tokens": 8})
    await env.score_rollout(state)
    well_formed(state, min_turns=2)
    assert state.stop_reason == "all_rounds_answered"
    assert state.num_turns == len(row["info"]["rounds"]) == len(state["answers"]) + 1
    assert [m["role"] for m in state.completion] == ["assistant", "user"] * (state.num_turns - 1) + [
        "assistant"
    ]
