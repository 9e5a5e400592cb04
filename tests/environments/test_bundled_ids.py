from __future__ import annotations

import pytest

import bridges

BUNDLED = ["alphabet_sort", "arithmetic", "guess_number", "repeat_letter", "repeat_letter_agent", "repeat_letter_tool",
           "repeat_letter_turns", "reverse_text"]
V1_TASKSETS = ["repeat_letter_taskset"]  # verifiers v1 tasksets (tests/adapters/test_verifiers_v1.py)


def test_every_bundled_module_is_listed() -> None:
    from bridges.envs.registry import list_bundled_environments

    assert list_bundled_environments() == sorted(BUNDLED + V1_TASKSETS)


@pytest.mark.parametrize("env_id", BUNDLED)
def test_bundled_ids_load_through_the_registry(env_id: str) -> None:
    env = bridges.load_environment(env_id, num_train=6, num_eval=4, seed=1)
    assert env.env_id == env_id and env.env_args == {"num_train": 6, "num_eval": 4, "seed": 1}
    assert (len(env.get_dataset()), len(env.get_eval_dataset())) == (6, 4)
    assert env.sampling_args["max_tokens"] > 0  # every bundled env bounds its completions by default
    dashed = env_id.replace("_", "-")
    assert bridges.load_environment(dashed, num_train=6, num_eval=4).env_id == dashed
