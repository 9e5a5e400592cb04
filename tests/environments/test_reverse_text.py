from __future__ import annotations

import pytest

from bridges.environments import reverse_text


def test_splits_have_the_requested_sizes_and_are_disjoint() -> None:
    env = reverse_text.load_environment(num_train=40, num_eval=10, seed=3)
    train, evalset = env.get_dataset(), env.get_eval_dataset()
    assert (len(train), len(evalset)) == (40, 10)
    assert {"prompt", "answer", "example_id", "info"} <= set(train.column_names)
    assert not set(train["answer"]) & set(evalset["answer"])
    row = evalset[0]
    assert row["prompt"][0] == {"role": "system", "content": reverse_text.SYSTEM_PROMPT}
    assert row["answer"] == row["info"]["text"][::-1]
    assert row["prompt"][-1]["content"] == row["info"]["text"]


def test_same_seed_same_data_other_seed_other_data() -> None:
    a = reverse_text.load_environment(num_train=5, num_eval=5, seed=1).get_eval_dataset()["answer"]
    b = reverse_text.load_environment(num_train=5, num_eval=5, seed=1).get_eval_dataset()["answer"]
    c = reverse_text.load_environment(num_train=5, num_eval=5, seed=2).get_eval_dataset()["answer"]
    assert a == b and a != c


def test_word_counts_respect_bounds() -> None:
    texts = reverse_text.make_texts(50, seed=0, min_words=2, max_words=3)
    assert {len(t.split()) for t in texts} == {2, 3}
    with pytest.raises(ValueError, match="min_words"):
        reverse_text.make_texts(5, seed=0, min_words=4, max_words=2)


def test_reward_is_similarity_of_the_parsed_answer() -> None:
    parser = reverse_text.load_environment(num_train=1, num_eval=1).parser
    answer = "olleh"

    def reply(text: str) -> list[dict[str, str]]:
        return [{"role": "assistant", "content": text}]

    assert reverse_text.reversal_similarity(reply("<answer>olleh</answer>"), answer, parser) == 1.0
    # "olleX" vs "olleh": 4 matching characters out of 5 + 5 -> 2 * 4 / 10
    assert reverse_text.reversal_similarity(reply("<answer>olleX</answer>"), answer, parser) == pytest.approx(
        0.8
    )
    assert reverse_text.reversal_similarity(reply("<answer>hello</answer>"), answer, parser) == pytest.approx(
        0.4
    )  # only "ll" matches
    assert reverse_text.reversal_similarity(reply("olleh"), answer, parser) == 0.0  # no answer tags
    assert reverse_text.reversal_similarity([], answer, parser) == 0.0


async def test_one_real_rollout(tiny_client, well_formed) -> None:
    env = reverse_text.load_environment(num_train=2, num_eval=2)
    row = env.get_eval_dataset()[0]
    state = await env.rollout(row, tiny_client, "tiny", {"max_tokens": 12, "temperature": 1.0})
    await env.score_rollout(state)
    well_formed(state)
    assert state.stop_reason == "completed"
    assert set(state.metrics) >= {"reversal_similarity"}
