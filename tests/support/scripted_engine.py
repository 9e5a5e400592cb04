"""An ``Engine`` that answers from a script over the decoded prompt: the same prompt, the same reply.

Equivalence tests feed one script to two paths — rl-bridges' and verifiers' own — so any difference in
rewards comes from the paths, not from sampling. Replies are tokenized with the model's real BPE
vocabulary and end with the template's end-of-turn id, as a model's would; ``max_tokens`` cuts them as
an engine does (finish ``length``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from bridges.envs.types import Sample, SamplingParams

_LETTER = re.compile(r"(?:[Ss]ay|Announce) ([a-h])\b")
_SEAT = re.compile(r"You are player (\d)")
_TURN_START = "<|im_start|>assistant"


def letter_script(prompt: str) -> str:
    """A reply that names the prompt's letter fully, partly or not at all, by the letter, the seat and
    how many replies came before — so rewards, stops and hooks vary across tasks, seats and turns.
    Offered tools, it calls the first one, then repeats what the tool answered."""
    found = _LETTER.findall(prompt)  # else the prompt is the letter itself (repeat_letter)
    letter = found[-1] if found else prompt.rsplit("<|im_start|>user\n", 1)[-1][:1]
    seat = _SEAT.search(prompt)
    earlier = prompt.count(_TURN_START) - 1  # the generation prompt opens one more
    choice = (earlier + ord(letter) + (int(seat.group(1)) if seat else 0)) % 3
    if "<tools>" in prompt:  # offered a tool: call it (right, short or with a wrong letter), then quote it
        if "<tool_response>" in prompt:
            return prompt.rsplit("<tool_response>\n", 1)[1].split("\n</tool_response>", 1)[0]
        name = re.search(r'"name": "(\w+)"', prompt.split("<tools>", 1)[1])
        call_letter, times = [(letter, 6), (letter, 3), ("x", 6)][choice]
        arguments = json.dumps({"letter": call_letter, "times": times})
        return f'<tool_call>\n{{"name": "{name.group(1) if name else "?"}", "arguments": {arguments}}}\n</tool_call>'
    return [letter * 6, letter * 3 + "xyz", "Umm, not now."][choice]


def bash_script(prompt: str) -> str:
    """A coding agent on verifiers' ``bash`` harness: it runs the task's command with the ``bash`` tool,
    then replies with the tool's output, except on odd-length outputs where it adds a word (so rewards
    vary across tasks)."""
    if "<tool_response>" in prompt:
        output = prompt.rsplit("<tool_response>\n", 1)[1].split("\n</tool_response>", 1)[0].strip()
        return output if len(output) % 2 == 0 else f"{output} done"
    command = re.search(r"Run: (.+?)\. Reply", prompt)
    arguments = json.dumps({"command": command.group(1) if command else "true"})
    return f'<tool_call>\n{{"name": "bash", "arguments": {arguments}}}\n</tool_call>'


class ScriptedEngine:
    name = "scripted"
    weight_version = 0
    max_model_len = None

    def __init__(self, tokenizer: Any, script: Callable[[str], str] = letter_script) -> None:
        self.tokenizer, self.script = tokenizer, script
        self.end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.calls: list[tuple[tuple[int, ...], tuple[int, ...]]] = []  # (prompt ids, sampled ids)

    async def generate(self, prompt_ids: list[int], params: SamplingParams, n: int = 1) -> list[Sample]:
        reply = self.script(self.tokenizer.decode(prompt_ids))
        ids = self.tokenizer.encode(reply, add_special_tokens=False) + [self.end_of_turn]
        finish = "length" if len(ids) > params.max_tokens else "stop"
        ids = ids[: params.max_tokens]
        self.calls.append((tuple(prompt_ids), tuple(ids)))
        return [Sample(list(ids), [-0.5] * len(ids), finish) for _ in range(n)]  # type: ignore[arg-type]

    async def aclose(self) -> None:
        return None
