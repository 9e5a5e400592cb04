"""repeat_letter prompts with a reward a random model already varies on (share of lowercase letters).

Tests that need every group to carry gradient use it, so they never depend on a lucky sample.
"""

from __future__ import annotations

import bridges as br
from bridges.environments import repeat_letter


def lowercase_share(completion) -> float:
    text = completion[-1]["content"] or ""
    return sum(ch.islower() for ch in text) / max(1, len(text))


def load_environment(**kwargs) -> br.Environment:
    env = repeat_letter.load_environment(**kwargs)
    env.rubric = br.Rubric(funcs=[lowercase_share])
    return env
