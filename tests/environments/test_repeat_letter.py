from __future__ import annotations

from collections import Counter

import pytest

from bridges.environments import repeat_letter


def reply(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def test_datasets_are_balanced_short_and_deterministic() -> None:
    env = repeat_letter.load_environment(num_train=64, seed=1)
    train, evalset = env.get_dataset(), env.get_eval_dataset()
    assert len(train) == 64 and Counter(train["answer"]) == dict.fromkeys("abcdefgh", 8)
    assert evalset["answer"] == list("abcdefgh")  # every letter once: the whole task space
    assert evalset[2]["prompt"] == [{"role": "user", "content": "c"}]  # no system prompt by default
    assert repeat_letter.load_environment(num_train=64, seed=1).get_dataset()["answer"] == train["answer"]
    assert repeat_letter.load_environment(num_train=64, seed=2).get_dataset()["answer"] != train["answer"]


def test_sampling_defaults_to_length_tokens() -> None:
    assert repeat_letter.load_environment().sampling_args == {"max_tokens": 6}
    assert repeat_letter.load_environment(length=4).sampling_args == {"max_tokens": 4}
    assert repeat_letter.load_environment(max_tokens=10).sampling_args == {"max_tokens": 10}


def test_dense_reward_exact_values() -> None:
    reward = repeat_letter.make_repeat_reward(6)
    assert reward(reply("cccccc"), "c") == 1.0
    assert reward(reply("cccccccc"), "c") == 1.0  # only the first 6 characters count
    assert reward(reply("ccc"), "c") == 0.5  # missing characters are wrong
    assert reward(reply("cxcxcx"), "c") == 0.5
    assert reward(reply("xccccc"), "c") == pytest.approx(5 / 6)
    assert reward(reply(""), "c") == 0.0
    assert reward([], "c") == 0.0
    assert repeat_letter.make_repeat_reward(3)(reply("aab"), "a") == pytest.approx(2 / 3)


def test_bad_arguments_are_one_sentence() -> None:
    with pytest.raises(ValueError, match="distinct"):
        repeat_letter.load_environment(alphabet="aab")
    with pytest.raises(ValueError, match="length"):
        repeat_letter.load_environment(length=0)


async def test_one_real_rollout(tiny_client, well_formed) -> None:
    env = repeat_letter.load_environment()
    state = await env.rollout(env.get_eval_dataset()[0], tiny_client, "tiny")
    await env.score_rollout(state)
    well_formed(state)
    assert state.stop_reason == "completed"
    assert len(state.turns[0].completion_ids) <= 6  # the env's sampling default reached the engine
    text = state.completion[0]["content"] or ""
    assert state.reward == pytest.approx(sum(ch == "a" for ch in text[:6]) / 6)
