"""Small environments for the TRL adapter tests; each reward varies on a random model's output.

``GROUP_CALLS`` records every call of the group reward function (the example ids it saw), so a
test can check that group functions see exactly one prompt's completions.
"""

from __future__ import annotations

from typing import Any

from datasets import Dataset

import bridges as br

GROUP_CALLS: list[list[int]] = []


def lowercase_share(completion) -> float:
    text = "".join(m.get("content") or "" for m in completion if m["role"] == "assistant")
    return sum(ch.islower() for ch in text) / max(1, len(text))


def group_rank(completions, example_ids) -> list[float]:
    """A group reward: 1 for the rollouts with the most lowercase letters in their group, else 0."""
    GROUP_CALLS.append(list(example_ids))
    counts = [sum(ch.islower() for m in c for ch in (m.get("content") or "")) for c in completions]
    return [float(c == max(counts)) for c in counts]


def _rows(count: int) -> Dataset:
    return Dataset.from_list([{"question": f"Say {i}.", "answer": str(i)} for i in range(count)])


def single_turn(**_: Any) -> br.Environment:
    return br.SingleTurnEnv(
        dataset=_rows(32),
        rubric=br.Rubric(funcs=[lowercase_share, group_rank], weights=[1.0, 0.5]),
        sampling_args={"max_tokens": 8},
    )


class TwoTurns(br.MultiTurnEnv):
    """The model speaks, the environment says 'again', the model speaks again."""

    async def env_response(self, messages, state):
        return [{"role": "user", "content": "again"}]


def two_turns(**_: Any) -> br.Environment:
    return TwoTurns(
        dataset=_rows(32),
        max_turns=2,
        rubric=br.Rubric(funcs=[lowercase_share, group_rank], weights=[1.0, 0.5]),
        sampling_args={"max_tokens": 8},
    )


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first integer
        b: the second integer
    """
    return a + b


def says_five(completion) -> float:
    return float("5" in (completion[-1].get("content") or ""))


def add_tool(**_: Any) -> br.Environment:
    """The conversation the fine-tuned tool model learned (tests/tool_model.py), as a ToolEnv."""
    from tool_model import ADD_TOOL, TOOL_PROMPT

    rows = [{"prompt": TOOL_PROMPT, "answer": "5"}] * 8
    env = br.ToolEnv(
        tools=[add], dataset=Dataset.from_list(rows), rubric=br.Rubric(funcs=[says_five]), max_turns=3
    )
    env.tool_defs = [ADD_TOOL]  # the exact schema the model was fine-tuned with
    return env
