"""The GPU smoke benchmark's task: the default task's prompts, rewarded by the share of the reply's
letters that are vowels. A random-init model's replies are random pieces of the vocabulary, so every
group has reward variance and every step trains: the benchmark times real optimizer steps, not skipped
ones. (A reward by length saturated: 128 random tokens always filled the budget, every reward was 1, and
no step trained.)"""

from __future__ import annotations

import bridges as br
from bridges.environments import repeat_letter


def vowel_share(completion) -> float:
    letters = [c for c in (completion[-1]["content"] or "").lower() if c.isalpha()]
    return sum(c in "aeiou" for c in letters) / len(letters) if letters else 0.0


def load_environment(**kwargs) -> br.Environment:
    env = repeat_letter.load_environment(**kwargs)
    env.rubric = br.Rubric(funcs=[vowel_share])
    return env
