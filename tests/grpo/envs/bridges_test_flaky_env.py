"""A repeat_letter variant whose reward function raises for every third rollout (fault injection)."""

from __future__ import annotations

import itertools

import bridges as br
from bridges.environments import repeat_letter

_calls = itertools.count()


def load_environment(**kwargs) -> br.Environment:
    env = repeat_letter.load_environment(**kwargs)

    def flaky(completion) -> float:
        if next(_calls) % 3 == 0:
            raise RuntimeError("judge unavailable")
        return 0.0

    env.rubric.add_reward_func(flaky, weight=0.0)
    return env
