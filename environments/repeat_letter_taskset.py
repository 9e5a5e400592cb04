"""The embedded default task (``repeat_letter``) written as a verifiers v1 taskset: download-free, CPU.

Needs the verifiers extra (0.3 or 0.4). The same prompts (one letter), the same dense reward (the
fraction of the first six characters equal to the letter) and the same six-token replies as
``repeat_letter``, declared the v1 way: typed ``TaskData``, a ``@vf.reward`` on the trace, a
``Taskset`` that yields the tasks, and an ``Env`` whose one agent sits on verifiers' ``null`` (chat)
harness — which rl-bridges runs in-process — so ``python -m bridges.train env=repeat_letter_taskset``
trains on it as it does on ``repeat_letter``.
"""

from __future__ import annotations

import random

from bridges.runtime.errors import require_extra

require_extra("verifiers", "verifiers", "the v1 taskset repeat_letter_taskset")  # one sentence if missing
import verifiers.v1 as vf  # noqa: E402
from verifiers.v1.harnesses.null import NullHarness  # noqa: E402
from verifiers.v1.types import content_text  # noqa: E402

LENGTH = 6


class LetterData(vf.TaskData):
    letter: str


class LetterTask(vf.Task[LetterData]):
    @vf.reward(weight=1.0)
    async def repeated_letter(self, trace: vf.Trace) -> float:
        """Fraction of the first six characters of the reply that equal the letter."""
        replies = [m for m in trace.messages if m.role == "assistant"]
        head = (content_text(replies[-1].content) if replies else "")[:LENGTH]
        return sum(char == self.data.letter for char in head) / LENGTH


class LetterTasksetConfig(vf.TasksetConfig):
    num_tasks: int = 512
    alphabet: str = "abcdefgh"
    seed: int = 0


class LetterTaskset(vf.Taskset[LetterTask, LetterTasksetConfig]):
    TASK: type[LetterTask] = LetterTask  # a subclass with more rewards reuses this loading

    def load(self) -> list[LetterTask]:
        """Every letter equally often, in a seeded order (as repeat_letter's train split)."""
        alphabet = self.config.alphabet
        letters = [alphabet[i % len(alphabet)] for i in range(self.config.num_tasks)]
        random.Random(self.config.seed).shuffle(letters)
        return [
            self.TASK(LetterData(idx=i, prompt=letter, letter=letter), self.config.task)
            for i, letter in enumerate(letters)
        ]


class LetterEnvConfig(vf.SingleAgentEnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig(sampling=vf.SamplingConfig(max_tokens=LENGTH))


class LetterEnv(vf.Env[LetterEnvConfig]):
    async def run(self, task: vf.Task, agents: vf.Agents) -> None:
        await agents.agent.run(task)


__all__ = ["LetterTaskset", "LetterEnv", "NullHarness"]
