from __future__ import annotations

import pytest

from bridges.environments import guess_number
from bridges.environments.guess_number import closeness, parse_guess, solved_reward
from bridges.envs.types import State


def assistant(*texts: str) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    for text in texts:
        out += [{"role": "assistant", "content": text}, {"role": "user", "content": "higher"}]
    return out[:-1]


INFO = {"low": 0, "high": 100, "secret": 37, "max_turns": 5}


def test_splits_sizes_disjoint_and_deterministic() -> None:
    env = guess_number.load_environment(num_train=50, num_eval=10, seed=2, max_turns=6)
    train, evalset = env.get_dataset(), env.get_eval_dataset()
    assert (len(train), len(evalset)) == (50, 10)
    key = lambda row: (row["info"]["low"], row["info"]["high"], row["info"]["secret"])  # noqa: E731
    assert not {key(r) for r in train} & {key(r) for r in evalset}
    for row in evalset:
        info = row["info"]
        assert info["low"] <= info["secret"] <= info["high"] and row["answer"] == str(info["secret"])
        assert f"between {info['low']} and {info['high']}" in row["prompt"][-1]["content"]
        assert info["max_turns"] == 6 and "6 guesses" in row["prompt"][-1]["content"]
    same = guess_number.load_environment(num_train=50, num_eval=10, seed=2, max_turns=6).get_eval_dataset()
    assert same["info"] == evalset["info"]


def test_parse_guess_takes_the_last_integer() -> None:
    assert parse_guess("between 1 and 100, I guess 42") == 42
    assert parse_guess("-3") == -3
    assert parse_guess("no idea") is None
    assert parse_guess(None) is None


def test_solved_reward_bonus_for_fewer_turns() -> None:
    assert solved_reward(assistant("37"), INFO) == 1.0
    assert solved_reward(assistant("50", "37"), INFO) == pytest.approx(0.875)  # 1 - 0.5 * 1/4
    assert solved_reward(assistant("50", "25", "30", "35", "37"), INFO) == pytest.approx(0.5)
    assert solved_reward(assistant("50", "25"), INFO) == 0.0
    assert solved_reward([], INFO) == 0.0


def test_closeness_metric_uses_the_last_valid_guess() -> None:
    assert closeness(assistant("50", "27"), INFO) == pytest.approx(0.9)
    assert closeness(assistant("27", "pass"), INFO) == pytest.approx(0.9)
    assert closeness(assistant("37"), INFO) == 1.0
    assert closeness(assistant("500"), INFO) == 0.0
    assert closeness(assistant("hmm"), INFO) == 0.0


async def test_env_response_says_higher_lower_correct_or_asks_for_a_number() -> None:
    env = guess_number.load_environment(num_train=1, num_eval=1)
    state = State(info=dict(INFO))
    await env.setup_state(state)

    async def reply(text: str) -> str:
        (message,) = await env.env_response([{"role": "assistant", "content": text}], state)
        assert message["role"] == "user"
        return message["content"]

    assert await reply("I guess 20") == "higher"
    assert await reply("80") == "lower"
    assert await reply("37") == "correct"
    assert await reply("a number?") == "Please answer with a single integer between 0 and 100."
    assert state["feedback"] == [
        "higher",
        "lower",
        "correct",
        "Please answer with a single integer between 0 and 100.",
    ]


def test_solved_stop_condition_fires_on_the_correct_guess() -> None:
    env = guess_number.load_environment(num_train=1, num_eval=1)
    assert not env.solved(State(info=dict(INFO), completion=assistant("50")))
    assert env.solved(State(info=dict(INFO), completion=assistant("50", "37")))
    assert not env.solved(State(info=dict(INFO)))


async def test_one_real_rollout(tiny_client, well_formed) -> None:
    env = guess_number.load_environment(num_train=2, num_eval=2, max_turns=3)
    state = await env.rollout(env.get_eval_dataset()[0], tiny_client, "tiny", {"max_tokens": 6})
    await env.score_rollout(state)
    well_formed(state)
    assert state.stop_reason in {"solved", "max_turns"}
    if state.stop_reason == "max_turns":
        assert state.num_turns == 3 and len(state["feedback"]) == 2
        assert [m["role"] for m in state.completion] == ["assistant", "user"] * 2 + ["assistant"]
    if not state.errored:
        assert set(state.metrics) >= {"solved_reward", "closeness"}
