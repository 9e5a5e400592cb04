"""The README's first quickstart, runnable as it stands (``tests/test_examples.py`` holds them equal).

    cd examples && python -m bridges.eval env=my_env model=tiny num_examples=8 rollouts_per_example=2
    cd examples && python -m bridges.train env=my_env trainer.max_steps=300

``bridges.eval`` finds this module because ``python -m`` puts the current folder on ``sys.path``;
installed packages exposing ``load_environment`` are found the same way from anywhere.
"""

from datasets import Dataset

import bridges as br


def load_environment(num_examples: int = 200) -> br.Environment:
    def rows(count: int) -> list[dict]:
        return [{"question": f"What is {i % 5} + {i % 5}?", "answer": str(2 * (i % 5))} for i in range(count)]
    def correct(completion, answer) -> float:  # ask for what you need by parameter name
        return float(completion[-1]["content"].strip() == answer)
    def a_number(completion) -> float:  # partial credit: something to learn before the first exact answer
        return float(completion[-1]["content"].strip().isdigit())
    return br.SingleTurnEnv(dataset=Dataset.from_list(rows(num_examples)), eval_dataset=Dataset.from_list(rows(20)),
                            system_prompt="Answer with the number only.",
                            rubric=br.Rubric(funcs=[correct, a_number], weights=[1.0, 0.2]),
                            sampling_args={"max_tokens": 2, "stop": ["\n"]})  # its own sampling: short answers
