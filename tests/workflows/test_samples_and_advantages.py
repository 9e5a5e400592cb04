"""Rollout state -> training samples and group advantages: masks, merging, failure isolation."""

from __future__ import annotations

import math

import pytest

from bridges.envs.types import State, Turn
from bridges.workflows.advantages import build_group, group_advantages
from bridges.workflows.samples import SampleStats, state_to_samples, truncate_sample


def _state(turns: list[Turn], reward: float | None = 1.0, **kw) -> State:
    return State(example_id=7, turns=turns, reward=reward, **kw)


def test_extending_turns_merge_into_one_sample_with_env_tokens_masked():
    t1 = Turn(prompt_ids=[1, 2, 3], completion_ids=[4, 5], logprobs=[-0.1, -0.2])
    # turn 2 prompt = turn 1 prompt + sampled + env/tool tokens [9, 9]
    t2 = Turn(prompt_ids=[1, 2, 3, 4, 5, 9, 9], completion_ids=[6], logprobs=[-0.3])
    stats = SampleStats()
    (sample,) = state_to_samples(_state([t1, t2]), advantage=0.5, stats=stats)
    assert sample.token_ids == [1, 2, 3, 4, 5, 9, 9, 6]
    assert sample.loss_mask == [0, 0, 0, 1, 1, 0, 0, 1]
    assert sample.logprobs == [0.0, 0.0, 0.0, -0.1, -0.2, 0.0, 0.0, -0.3]
    assert sample.advantage == 0.5 and sample.prompt_length == 3 and sample.num_loss_tokens == 3
    assert (stats.samples, stats.breaks) == (1, 0)


def test_non_extending_turn_starts_a_new_sample_and_is_counted():
    t1 = Turn(prompt_ids=[1, 2], completion_ids=[3], logprobs=[-1.0])
    t2 = Turn(prompt_ids=[1, 7, 3, 8], completion_ids=[4], logprobs=[-2.0])  # history re-rendered
    stats = SampleStats()
    samples = state_to_samples(_state([t1, t2]), advantage=1.0, stats=stats)
    assert [s.token_ids for s in samples] == [[1, 2, 3], [1, 7, 3, 8, 4]]
    assert [s.loss_mask for s in samples] == [[0, 0, 1], [0, 0, 0, 0, 1]]
    assert (stats.samples, stats.breaks) == (2, 1)


def test_failed_rollout_is_fully_masked_with_zero_advantage():
    t1 = Turn(prompt_ids=[1], completion_ids=[2, 3], logprobs=[-0.5, -0.5])
    state = _state([t1], reward=None, stop_reason="env_error", error="boom")
    assert not state.trainable
    (sample,) = state_to_samples(state, advantage=3.0)
    assert sample.loss_mask == [0, 0, 0] and sample.advantage == 0.0 and not sample.valid


def test_logprob_count_mismatch_is_refused_with_a_sentence():
    bad = Turn(prompt_ids=[1], completion_ids=[2, 3], logprobs=[-0.5])
    with pytest.raises(ValueError, match="one logprob per sampled id"):
        state_to_samples(_state([bad]), advantage=1.0)


def test_grpo_and_dr_grpo_advantages_use_valid_members_only():
    rewards = [1.0, 0.0, None, 0.5]
    valid = [True, True, False, True]
    adv, skip = group_advantages(rewards, valid, "grpo")
    mean, std = 0.5, math.sqrt(((0.5) ** 2 + (0.5) ** 2 + 0) / 2)  # the sample std of the valid three
    assert skip is None
    assert adv[2] == 0.0  # the failed member is masked, not a fake zero in the baseline
    assert adv[0] == pytest.approx((1.0 - mean) / (std + 1e-6))
    assert adv[1] == pytest.approx((0.0 - mean) / (std + 1e-6))
    dr, _ = group_advantages(rewards, valid, "dr_grpo")
    assert dr == pytest.approx([0.5, -0.5, 0.0, 0.0])


@pytest.mark.parametrize(
    ("rewards", "valid", "reason"),
    [([1.0, 1.0, 1.0], [True] * 3, "zero_variance"), ([1.0, 0.0], [True, False], "too_few_valid")],
)
def test_groups_without_signal_contribute_no_gradient(rewards, valid, reason):
    adv, skip = group_advantages(rewards, valid)
    assert skip == reason and adv == [0.0] * len(rewards)


def test_build_group_marks_contribution():
    states = [
        _state([Turn(prompt_ids=[1], completion_ids=[2], logprobs=[-0.1])], reward=r) for r in (0.0, 1.0)
    ]
    group = build_group(states)
    assert group.contributes_gradient and group.num_valid == 2
    assert group.advantages[0] < 0 < group.advantages[1]


def test_truncate_keeps_lists_aligned():
    t1 = Turn(prompt_ids=[1, 2], completion_ids=[3, 4, 5], logprobs=[-1.0, -2.0, -3.0])
    (sample,) = state_to_samples(_state([t1]), advantage=1.0)
    cut = truncate_sample(sample, 4)
    assert cut.token_ids == [1, 2, 3, 4] and cut.loss_mask == [0, 0, 1, 1] and cut.logprobs == [0, 0, -1, -2]
