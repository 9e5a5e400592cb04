"""Reverse a short generated text, character by character (single turn, partial credit).

A classic first RL task: the answer is checkable exactly, yet a similarity ratio gives a dense
signal, so a policy that gets most characters in place already earns most of the reward.
Texts are random word sequences drawn from the word list below (written for this project), so the
environment needs no download and any number of rows can be generated from a seed.
"""

from __future__ import annotations

import difflib
import random
from typing import Any

from bridges import ConfigError, Parser, Rubric, SingleTurnEnv, XMLParser

_WORDS_TEXT = """
apple river stone cloud green quick lamp bread chair ocean tiger music paper light storm garden
window silver candle forest bridge pencil rocket winter summer yellow purple orange sugar honey
butter coffee planet engine button mirror basket ladder castle dragon falcon hammer island jacket
kettle lemon magnet needle pillow rabbit saddle tunnel violin wagon zebra anchor barrel cactus
dolphin feather glacier harbor igloo jungle koala lantern meadow nectar orbit parrot quartz ribbon
shadow timber umbrella valley walnut crystal puzzle marble velvet copper pepper cotton canyon
desert breeze comet meteor pebble spiral
"""
WORDS = tuple(_WORDS_TEXT.split())

SYSTEM_PROMPT = "Reverse the text character by character. Put your answer inside <answer></answer> tags."


def make_texts(count: int, seed: int, min_words: int, max_words: int) -> list[str]:
    """``count`` distinct texts: distinct so that the train and eval splits can never share a row."""
    if not 1 <= min_words <= max_words:
        raise ConfigError(
            f"need 1 <= min_words <= max_words, got min_words={min_words}, max_words={max_words}."
        )
    rng = random.Random(seed)
    texts: dict[str, None] = {}
    for _ in range(count * 50):
        if len(texts) == count:
            break
        texts.setdefault(" ".join(rng.choices(WORDS, k=rng.randint(min_words, max_words))))
    if len(texts) < count:
        raise ConfigError(
            f"cannot generate {count} distinct texts of {min_words}-{max_words} words; widen the range."
        )
    return list(texts)


def build_rows(texts: list[str]) -> dict[str, list[Any]]:
    return {
        "question": texts,
        "answer": [text[::-1] for text in texts],
        "info": [{"text": text} for text in texts],
    }


def similarity(a: str, b: str) -> float:
    """Longest-matching-blocks ratio in [0, 1]: 1.0 only for an exact match."""
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


def reversal_similarity(completion: list[dict[str, Any]], answer: str, parser: Parser) -> float:
    """Similarity of the parsed answer to the reversed text; no parseable answer scores 0."""
    parsed = parser.parse_answer(completion)
    return similarity(parsed.strip(), answer) if parsed else 0.0


def load_environment(
    num_train: int = 1000,
    num_eval: int = 100,
    seed: int = 0,
    min_words: int = 2,
    max_words: int = 5,
    max_tokens: int = 64,
    **kwargs: Any,
) -> SingleTurnEnv:
    from datasets import Dataset

    texts = make_texts(num_train + num_eval, seed, min_words, max_words)
    parser = XMLParser(["answer"], answer_field="answer")
    return SingleTurnEnv(
        dataset=lambda: Dataset.from_dict(build_rows(texts[num_eval:])),
        eval_dataset=lambda: Dataset.from_dict(build_rows(texts[:num_eval])),
        system_prompt=SYSTEM_PROMPT,
        parser=parser,
        rubric=Rubric(funcs=[reversal_similarity], weights=[1.0], parser=parser),
        sampling_args={"max_tokens": max_tokens, **kwargs.pop("sampling_args", {})},
        **kwargs,
    )
