"""A reward that depends strongly on the sampling temperature, for the comparison tests.

Reward = share of distinct characters in the reply: a near-greedy random model repeats itself, a
temperature-1 sample rarely does.
"""

from __future__ import annotations

from datasets import Dataset

import bridges as br


def distinct_share(completion) -> float:
    text = completion[-1]["content"] or ""
    return len(set(text)) / max(1, len(text))


def load_environment(**_: object) -> br.Environment:
    rows = [
        {"question": f"Tell me about {word}.", "answer": ""}
        for word in ("cats", "dogs", "rain", "maps", "tea", "jazz")
    ]
    return br.SingleTurnEnv(
        dataset=Dataset.from_list(rows),
        rubric=br.Rubric(funcs=[distinct_share]),
        sampling_args={"max_tokens": 12},
    )
