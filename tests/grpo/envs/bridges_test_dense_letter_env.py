"""repeat_letter with the share of lowercase letters as a second reward (weights 1 and 1): the native twin of
``tests/fixtures/vf_v1_dense_letter_taskset.py``, so short runs compare step for step on a reward that spreads."""

from __future__ import annotations

import bridges as br
from bridges.environments import repeat_letter


def lowercase_share(completion) -> float:
    text = completion[-1]["content"] or ""
    return sum(ch.islower() for ch in text) / max(1, len(text))


def load_environment(**kwargs) -> br.Environment:
    env = repeat_letter.load_environment(**kwargs)
    env.rubric = br.Rubric(funcs=[*env.rubric.funcs, lowercase_share], weights=[*env.rubric.weights, 1.0])
    return env
