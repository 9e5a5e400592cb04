"""One definition of a rollout valid for training: the rollout state's, read by every backend."""

from __future__ import annotations


def test_one_definition_of_a_trainable_rollout():
    from bridges.envs.types import State, Turn
    from bridges.workflows.advantages import build_group
    from bridges.workflows.samples import state_to_samples

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
        assert build_group([state, state]).num_valid == 2 * expected
        assert all(s.valid is expected for s in state_to_samples(state, advantage=1.0))
