"""A two-turn environment whose rows say which fault to inject, so one batch carries every fault.

Row ``case`` values: ``ok``; ``env_raises`` (env_response raises); ``reward_raises`` (the reward
function raises); ``overlong`` (a prompt longer than the model's context window); ``engine:<fault>``
(the prompt carries a marker that ``FaultyEngine.plan_prompts`` matches). ``half`` (odd rows raise
in env_response, even ones are fine) is the mixed batch the backend tests train on. ``reward_nan``,
``reward_inf``, ``reward_str`` (the reward returns NaN, inf, the string "0.5"); ``env_hangs`` (an
async env_response that never returns), ``stop_hangs`` (a sync stop condition that never returns),
``reward_hangs`` (a sync reward function that never returns): the hangs are bounded by
``hook_timeout`` and ``reward_timeout``.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

from datasets import Dataset

import bridges as br

CASES = ["ok", "env_raises", "reward_raises", "overlong", "engine:permanent", "engine:hang", "engine:nan",
         "engine:none", "engine:transient"]


BAD_REWARDS = {"reward_nan": math.nan, "reward_inf": math.inf, "reward_str": "0.5"}


def lowercase_share(completion, info) -> Any:
    case = info.get("case")
    if case == "reward_raises":
        raise RuntimeError("injected reward failure")
    if case in BAD_REWARDS:
        return BAD_REWARDS[case]
    while case == "reward_hangs":
        time.sleep(0.05)
    text = "".join(m.get("content") or "" for m in completion if m["role"] == "assistant")
    return sum(ch.islower() for ch in text) / max(1, len(text))


class FaultEnv(br.MultiTurnEnv):
    async def env_response(self, messages, state):
        case = state.info.get("case")
        if case == "env_raises" or (case == "half" and state.example_id % 2):
            raise RuntimeError("injected env_response failure")
        if case == "env_hangs":
            await asyncio.Event().wait()
        return [{"role": "user", "content": "again"}]

    @br.stop
    def stuck(self, state) -> bool:
        while state.info.get("case") == "stop_hangs" and state.turns:
            time.sleep(0.05)
        return False


def load_environment(
    cases: list[str] | None = None,
    repeat: int = 1,
    hook_timeout: float = 120.0,
    reward_timeout: float = 60.0,
    **_: Any,
) -> br.Environment:
    rows = []
    for case in cases or CASES:
        for _ in range(repeat):
            question = "x" * 6000 if case == "overlong" else f"[{case}] say something"
            rows.append({"question": question, "answer": "", "info": {"case": case}})
    env = FaultEnv(
        dataset=Dataset.from_list(rows),
        rubric=br.Rubric(funcs=[lowercase_share], timeout=reward_timeout),
        hook_timeout=hook_timeout,
        max_turns=2,
        sampling_args={"max_tokens": 6},
        model_timeout=2.0,
        max_retries=1,
        retry_base_delay=0.01,
    )
    return env
