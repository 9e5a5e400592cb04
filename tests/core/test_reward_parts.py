"""Each rubric function's own curve: the step row's ``reward/<function>/…`` keys, the progress text and the
end-of-run lines, including the one that says the total rose only through partial credit."""

from __future__ import annotations

import pytest

from bridges.envs.types import State, Turn
from bridges.runs.reward_parts import function_means, progress_text, summary_lines
from bridges.workflows.batches import step_metrics, step_tallies
from bridges.workflows.samples import SampleStats
from bridges.workflows.types import Group


def _state(correct: float, partial: float, trainable: bool = True) -> State:
    state = State(prompt=[{"role": "user", "content": "q"}], example_id=0)
    state.turns = [Turn(prompt_ids=[1], completion_ids=[2], logprobs=[-0.5], weight_version=0)]
    state.metrics = {"correct": correct, "a_number": partial, "num_turns": 1.0}
    state.reward = correct + 0.2 * partial
    if not trainable:
        state.error, state.stop_reason = "reward function 'correct' raised ValueError: x", "reward_error"
    return state


def test_each_function_is_tallied_from_the_valid_episodes_and_adds_across_processes():
    group = Group(example_id=0, states=[_state(1, 1), _state(0, 1), _state(0, 0), _state(1, 1, trainable=False)])
    one = step_tallies([group], SampleStats(), 0, ("correct", "a_number"))
    both = {k: 2 * v for k, v in one.items()}  # two processes with the same share: sums add
    row = step_metrics(both)
    assert row["reward/correct/mean"] == pytest.approx(1 / 3) and row["reward/a_number/mean"] == pytest.approx(2 / 3)
    assert row["reward/correct/std"] == pytest.approx((2 / 9) ** 0.5)
    assert "reward/num_turns/mean" not in row  # a metric that is not a rubric function is not a reward
    assert step_metrics(step_tallies([group], SampleStats(), 0))["reward/mean"] is not None  # names are optional


def _rows(correct: list[float], partial: list[float]) -> list[dict]:
    return [{"step": i + 1, "reward/mean": c + 0.2 * p, "reward/correct/mean": c, "reward/a_number/mean": p}
            for i, (c, p) in enumerate(zip(correct, partial, strict=True))]


def test_the_progress_text_and_summary_name_each_function():
    rows = _rows([0.0] * 5 + [0.5] * 5, [0.2] * 5 + [0.9] * 5)
    assert function_means(rows[0]) == {"correct": 0.0, "a_number": 0.2}
    assert progress_text(rows[-1]) == " (correct 0.500, a_number 0.900)"
    assert summary_lines(rows) == ["  correct: 0.000 -> 0.500", "  a_number: 0.200 -> 0.900"]
    assert progress_text({"reward/mean": 1.0, "reward/only/mean": 1.0}) == ""  # one function: the total says it


def test_a_total_that_rose_only_through_partial_credit_says_so():
    lines = summary_lines(_rows([0.0] * 10, [0.0] * 5 + [1.0] * 5))
    assert lines[-1] == "the reward rose only through a_number: correct did not move."
    assert not summary_lines(_rows([0.0] * 10, [0.0] * 10))[-1].startswith("the reward rose")  # nothing rose
