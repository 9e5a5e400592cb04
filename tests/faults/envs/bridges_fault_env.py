"""A two-turn environment whose rows say which fault to inject, so one batch carries every fault.

Row ``case`` values: ``ok``; ``env_raises`` (env_response raises); ``reward_raises`` (the reward
function raises); ``overlong`` (a prompt longer than the model's context window); ``engine:<fault>``
(the prompt carries a marker that ``FaultyEngine.plan_prompts`` matches). ``half`` (odd rows raise
in env_response, even ones are fine) is the mixed batch the backend tests train on.
"""

from __future__ import annotations

from typing import Any

from datasets import Dataset

import bridges as br

CASES = ["ok", "env_raises", "reward_raises", "overlong", "engine:permanent", "engine:hang", "engine:nan",
         "engine:none", "engine:transient"]  # fmt: skip


def lowercase_share(completion, info) -> float:
    if info.get("case") == "reward_raises":
        raise RuntimeError("injected reward failure")
    text = "".join(m.get("content") or "" for m in completion if m["role"] == "assistant")
    return sum(ch.islower() for ch in text) / max(1, len(text))


class FaultEnv(br.MultiTurnEnv):
    async def env_response(self, messages, state):
        case = state.info.get("case")
        if case == "env_raises" or (case == "half" and state.example_id % 2):
            raise RuntimeError("injected env_response failure")
        return [{"role": "user", "content": "again"}]


def load_environment(cases: list[str] | None = None, repeat: int = 1, **_: Any) -> br.Environment:
    rows = []
    for case in cases or CASES:
        for _ in range(repeat):
            question = "x" * 6000 if case == "overlong" else f"[{case}] say something"
            rows.append({"question": question, "answer": "", "info": {"case": case}})
    env = FaultEnv(
        dataset=Dataset.from_list(rows),
        rubric=br.Rubric(funcs=[lowercase_share]),
        max_turns=2,
        sampling_args={"max_tokens": 6},
        model_timeout=2.0,
        max_retries=1,
        retry_base_delay=0.01,
    )
    return env
