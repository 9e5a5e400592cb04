"""The embedded default task (``repeat_letter``) played by an agent that lives outside the environment.

The agent is ordinary OpenAI SDK code, written as if it called any hosted model: it asks for the
letter, then asks once more ("Again.") with the conversation so far, and returns its last answer.
``AgentEnv`` hands it a base URL of its own for each rollout; the two calls it makes there are the
rollout (one sample: the second prompt extends the first call's, token for token). The reward is
``repeat_letter``'s, on the agent's final answer, so this trains from scratch on the CPU like the
default job: ``python -m bridges.train env=repeat_letter_agent``.

``command=true`` runs the same agent as a separate program (``python -m
bridges.environments.repeat_letter_agent``), reached through ``OPENAI_BASE_URL`` and
``OPENAI_API_KEY`` and given its row on stdin, as a command-line agent would be.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import sys
from typing import Any

from bridges import AgentEnv, Rubric
from bridges.environments.repeat_letter import check_task, letter_splits, make_repeat_reward

FOLLOW_UP = "Again."


TLS = ssl.create_default_context()  # one for every client: building one loads the CA bundle (~50 ms)


async def letter_agent(base_url: str, api_key: str, row: dict[str, Any]) -> str:
    """Two calls on one conversation: the task, then a follow-up; returns the last reply. A client per
    rollout, as most agents are written; sharing the TLS context is what keeps that cheap."""
    from openai import AsyncOpenAI, DefaultAsyncHttpxClient

    http = DefaultAsyncHttpxClient(verify=TLS)  # the SDK's own client and defaults, but for the TLS context
    async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, http_client=http) as client:
        messages: list[Any] = list(row["prompt"])
        reply = ""
        for _ in range(2):
            response = await client.chat.completions.create(model="letter-model", messages=messages)
            reply = response.choices[0].message.content or ""
            messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": FOLLOW_UP}]
        return reply


def final_answer(state: Any, answer: str, length: int) -> float:
    """``repeat_letter``'s reward on what the agent returned (its own view of its answer)."""
    result = state["agent"].result
    return make_repeat_reward(length)([{"role": "assistant", "content": str(result or "")}], answer)


def load_environment(
    num_train: int = 512, num_eval: int = 8, seed: int = 0, alphabet: str = "abcdefgh", length: int = 6,
    command: bool = False, agent_timeout: float = 60.0, **kwargs: Any,
) -> AgentEnv:
    def reward(state: Any, answer: str) -> float:
        return final_answer(state, answer, length)

    check_task(alphabet, length)
    sampling_args = {"max_tokens": length, **kwargs.pop("sampling_args", {})}
    return AgentEnv(
        None if command else letter_agent,
        command=[sys.executable, "-m", __name__] if command else None,
        agent_timeout=agent_timeout,
        **letter_splits(alphabet, num_train, num_eval, seed),
        rubric=Rubric(funcs=[reward], weights=[1.0]),
        sampling_args=sampling_args,
        **kwargs,
    )


if __name__ == "__main__":  # the command form: the row on stdin, the endpoint in the environment
    import os

    row = json.load(sys.stdin)
    print(asyncio.run(letter_agent(os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"], row)))
