"""Answer with the letter from the prompt, repeated: the embedded default task for RL from scratch.

A randomly initialised tiny model (character-level tokenizer, ~100 tokens) starts with about a 1%
chance per token of emitting the right letter, so a sparse "exactly right" reward would almost
never fire. The reward here is dense (the fraction of the first ``length`` characters that are
right), the prompt is a few characters, and completions are capped at ``length`` tokens, so a
CPU run of a few minutes shows the reward climbing.

The whole task space is the alphabet (one prompt per letter), so unlike the other bundled
environments the two splits cannot be disjoint: the eval split lists every letter (cycling when
``num_eval`` exceeds the alphabet), the train split is a balanced, seeded shuffle of the letters.
"""

from __future__ import annotations

import random
from typing import Any

from bridges import ConfigError, Rubric, SingleTurnEnv


def build_rows(letters: list[str], prompt_template: str) -> dict[str, list[Any]]:
    return {
        "prompt": [
            [{"role": "user", "content": prompt_template.format(letter=letter)}] for letter in letters
        ],
        "answer": letters,
    }


def train_letters(alphabet: str, count: int, seed: int) -> list[str]:
    """Every letter equally often (a balanced task), in a seeded order."""
    letters = [alphabet[i % len(alphabet)] for i in range(count)]
    random.Random(seed).shuffle(letters)
    return letters


def completion_text(completion: list[dict[str, Any]] | str) -> str:
    if isinstance(completion, str):
        return completion
    return "".join(m.get("content") or "" for m in completion if m.get("role") == "assistant")


def make_repeat_reward(length: int):
    def repeated_letter(completion: list[dict[str, Any]], answer: str) -> float:
        """Fraction of the first ``length`` characters that equal the letter; missing characters are wrong."""
        head = completion_text(completion)[:length]
        return sum(char == answer for char in head) / length

    return repeated_letter


def letter_splits(
    alphabet: str, num_train: int, num_eval: int, seed: int, prompt_template: str = "{letter}"
) -> dict[str, Any]:
    """``dataset`` and ``eval_dataset`` (built when first asked for) for every kind of the task: the balanced,
    seeded train letters, and each letter in turn for eval (-1: the alphabet once)."""
    from datasets import Dataset

    num_eval = len(alphabet) if num_eval < 0 else num_eval
    eval_letters = [alphabet[i % len(alphabet)] for i in range(num_eval)]
    return {
        "dataset": lambda: Dataset.from_dict(build_rows(train_letters(alphabet, num_train, seed), prompt_template)),
        "eval_dataset": lambda: Dataset.from_dict(build_rows(eval_letters, prompt_template)),
    }


def check_task(alphabet: str, length: int) -> None:
    """The task's two settings, shared by its every kind (turns, tool, agent): one sentence if unusable."""
    if not alphabet or len(set(alphabet)) != len(alphabet):
        raise ConfigError(f"alphabet must be non-empty distinct characters, got {alphabet!r}.")
    if length < 1:
        raise ConfigError(f"length must be at least 1, got {length}.")


def load_environment(
    num_train: int = 512,
    num_eval: int = -1,
    seed: int = 0,
    alphabet: str = "abcdefgh",
    length: int = 6,
    max_tokens: int | None = None,
    prompt_template: str = "{letter}",
    **kwargs: Any,
) -> SingleTurnEnv:
    check_task(alphabet, length)
    sampling_args = {"max_tokens": max_tokens or length, **kwargs.pop("sampling_args", {})}
    return SingleTurnEnv(
        **letter_splits(alphabet, num_train, num_eval, seed, prompt_template),
        rubric=Rubric(funcs=[make_repeat_reward(length)], weights=[1.0]),
        sampling_args=sampling_args,
        **kwargs,
    )
