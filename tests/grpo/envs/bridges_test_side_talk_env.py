"""The embedded task played by an agent that breaks its ledger on every rollout: it asks for the letter,
then opens a side conversation (a fresh prompt, not an extension of the first call), and answers with
the first reply. Two sequences a rollout, one break each: what ``trainer.ledger_breaks`` decides about."""

from __future__ import annotations

from typing import Any

from bridges import AgentEnv, Rubric
from bridges.environments.repeat_letter import letter_splits, make_repeat_reward


async def side_talk(base_url: str, api_key: str, row: dict[str, Any]) -> str:
    from openai import AsyncOpenAI

    async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        first = await client.chat.completions.create(model="m", messages=list(row["prompt"]))
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "b"}])
        return first.choices[0].message.content or ""


def load_environment(**kwargs: Any) -> AgentEnv:
    reward = make_repeat_reward(6)

    def repeated(state: Any, answer: str) -> float:
        return reward([{"role": "assistant", "content": str(state["agent"].result or "")}], answer)

    return AgentEnv(side_talk, **letter_splits("abcdefgh", 64, 8, 0), rubric=Rubric(funcs=[repeated]),
                    sampling_args={"max_tokens": 6}, **kwargs)
