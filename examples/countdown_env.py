"""The multi-turn example of docs/guide/environments.md: count down, the environment checks each turn."""

from datasets import Dataset

import bridges as br


def correct_steps(completion, info) -> float:  # parameters are asked for by name
    said = [m["content"].strip() for m in completion if m["role"] == "assistant"]
    expected = [str(n) for n in range(info["start"] - 1, info["start"] - 1 - len(said), -1)]
    return sum(a == b for a, b in zip(said, expected, strict=True)) / max(1, info["start"])


class Countdown(br.MultiTurnEnv):
    async def env_response(self, messages, state):
        return [{"role": "user", "content": "next"}]  # the environment's turn

    @br.stop
    def reached_zero(self, state) -> bool:  # checked after every model turn
        return bool(state.completion) and state.completion[-1]["content"].strip() == "0"


def load_environment(count: int = 32, max_turns: int = 6) -> br.Environment:
    rows = [{"question": f"Count down from {n}, one number per reply.", "answer": "0",
             "info": {"start": n}} for n in range(3, 3 + count)]
    rubric = br.Rubric(funcs=[correct_steps])
    return Countdown(dataset=Dataset.from_list(rows), rubric=rubric, max_turns=max_turns)
