"""One definition of a rollout valid for training, shared by the rollout state and the episode."""

from __future__ import annotations


def test_one_definition_of_a_trainable_rollout_for_state_and_episode():
    from bridges.types import State, Turn
    from bridges.workflows.samples import episode_from_state

    turn = Turn(prompt_ids=[1, 2], completion_ids=[3], logprobs=[-0.5])
    cases = [
        (State(reward=1.0, turns=[turn]), True),
        (State(reward=None, turns=[turn]), False),  # not scored
        (State(reward=1.0, turns=[Turn()]), False),  # no token ids: a remote endpoint's rollout
        (State(reward=1.0, turns=[turn], error="boom", stop_reason="env_error"), False),
        (State(reward=1.0, turns=[turn], stop_reason="prompt_too_long"), False),
    ]
    for state, expected in cases:
        assert state.trainable is expected
        assert episode_from_state(state).valid is expected
