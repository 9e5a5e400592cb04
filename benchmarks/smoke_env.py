"""The GPU smoke benchmark's task: the default task's prompts, rewarded by how much text the reply
holds (its characters over 200). A random-init model's replies differ in length, so every group has
reward variance and every step trains: the benchmark times real optimizer steps, not skipped ones."""

from __future__ import annotations

import bridges as br
from bridges.environments import repeat_letter


def text_length(completion) -> float:
    return min(1.0, len(completion[-1]["content"] or "") / 200)


def load_environment(**kwargs) -> br.Environment:
    env = repeat_letter.load_environment(**kwargs)
    env.rubric = br.Rubric(funcs=[text_length])
    return env
