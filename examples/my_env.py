"""A whole environment in one file: the README's first quickstart, runnable as it stands.

    cd examples && python -m bridges.eval env=my_env model=tiny num_examples=8 rollouts_per_example=2

``bridges.eval`` finds this module because ``python -m`` puts the current folder on ``sys.path``;
installed packages exposing ``load_environment`` are found the same way from anywhere.
"""

from __future__ import annotations

from datasets import Dataset

import bridges as br


def load_environment(num_examples: int = 100) -> br.Environment:
    rows = [{"question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(num_examples)]

    def correct(completion, answer) -> float:  # ask for what you need by parameter name
        return float(completion[-1]["content"].strip() == answer)

    def short(completion) -> float:  # a second signal, weighted below
        return 1.0 if len(completion[-1]["content"]) < 20 else 0.0

    return br.SingleTurnEnv(
        dataset=Dataset.from_list(rows),
        system_prompt="Answer with the number only.",
        rubric=br.Rubric(funcs=[correct, short], weights=[1.0, 0.1]),
    )
