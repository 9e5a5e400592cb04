"""A command-line agent that speaks Anthropic's Messages API, trained as a separate program.

    cd examples/agents
    python -m bridges.eval env=messages_cli_agent model=tiny-qwen2.5 num_examples=2 split=train

Run as a program (``python messages_cli_agent.py``), it is what a CLI coding agent is to
``AgentEnv``: it finds its model through ``ANTHROPIC_BASE_URL`` and ``ANTHROPIC_API_KEY`` (which
``AgentEnv`` points at the rollout's session), reads its task from stdin (the row as JSON), offers
the model one tool, answers its ``tool_use`` blocks with ``tool_result`` blocks until it stops, and
prints its final text. ``load_environment`` wraps that program in ``AgentEnv(command=...)``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

SHOUT = {
    "name": "shout",
    "description": "Repeat a letter a number of times.",
    "input_schema": {"type": "object", "properties": {"letter": {"type": "string"}, "times": {"type": "integer"}}},
}


def shout(letter: str = "", times: int = 1) -> str:
    return str(letter) * max(0, min(int(times), 64))


def run(task: str) -> str:
    import anthropic

    client = anthropic.Anthropic(base_url=os.environ["ANTHROPIC_BASE_URL"], api_key=os.environ["ANTHROPIC_API_KEY"])
    messages: list[Any] = [{"role": "user", "content": task}]
    for _ in range(4):
        reply = client.messages.create(model="policy", max_tokens=64, system="Be brief.", tools=[SHOUT], messages=messages)
        messages.append({"role": "assistant", "content": [block.model_dump() for block in reply.content]})
        uses = [block for block in reply.content if block.type == "tool_use"]
        if not uses:
            return "".join(block.text for block in reply.content if block.type == "text")
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": use.id,
             "content": shout(use.input.get("letter", ""), use.input.get("times", 1))} for use in uses]})
    return ""


def load_environment(num_train: int = 64, **kwargs: Any) -> Any:
    from datasets import Dataset

    from bridges import AgentEnv, Rubric
    from bridges.environments.repeat_letter import build_rows, make_repeat_reward, train_letters

    def repeated_letter(state: Any, answer: str) -> float:
        printed = state["agent"].output.strip()
        return make_repeat_reward(6)([{"role": "assistant", "content": printed}], answer)

    return AgentEnv(
        command=[sys.executable, os.path.abspath(__file__)],
        dataset=lambda: Dataset.from_dict(build_rows(train_letters("abcdefgh", num_train, 0), "Say {letter}")),
        rubric=Rubric(funcs=[repeated_letter]),
        **kwargs,
    )


if __name__ == "__main__":
    row = json.load(sys.stdin)
    print(run(row["prompt"][-1]["content"]))
