"""Sort names alphabetically, then keep the list sorted as more names arrive (multi-turn).

Later turns only make sense in the light of earlier ones (the model must remember the names it
was given before), which is what separates a multi-turn task from a batch of single turns. Every
turn is scored, so a policy that gets round one right but loses track later earns partial credit.
"""

from __future__ import annotations

import difflib
import random
import re
from typing import Any

from bridges import ConfigError, MultiTurnEnv, Rubric, State, stop

_NAMES_TEXT = """
Ada Alan Alice Amara Anton Beatrix Bruno Carla Cedric Clara Dmitri Diego Edith Elena Emil Farah
Felix Freya Gustav Greta Hana Hugo Ida Igor Ingrid Jonas Julia Kai Karim Lena Leo Lucia Malik Mara
Milo Nadia Nils Nora Olga Oscar Paula Pavel Quinn Rafael Rosa Rudy Sami Sofia Stefan Talia Theo Uma
Ulrich Vera Viktor Wanda Wilhelm Xena Yara Yusuf Zoe Zoran
"""
NAMES = tuple(_NAMES_TEXT.split())
FORMAT = "Reply with the names only, one per line."


def make_games(count: int, seed: int, min_rounds: int = 2, max_rounds: int = 3) -> list[list[list[str]]]:
    """``count`` distinct games; a game is a list of rounds, each the list of names revealed in it."""
    rng = random.Random(seed)
    games: dict[tuple[tuple[str, ...], ...], None] = {}
    for _ in range(count * 50):
        if len(games) == count:
            break
        rounds = rng.randint(min_rounds, max_rounds)
        sizes = [rng.randint(3, 5)] + [rng.randint(1, 3) for _ in range(rounds - 1)]
        names = rng.sample(NAMES, sum(sizes))
        starts = [sum(sizes[:i]) for i in range(rounds)]
        games.setdefault(tuple(tuple(names[s : s + n]) for s, n in zip(starts, sizes, strict=True)))
    if len(games) < count:
        raise ConfigError(f"cannot generate {count} distinct games; ask for fewer rows.")
    return [[list(r) for r in game] for game in games]


def expected_lists(rounds: list[list[str]]) -> list[list[str]]:
    """The correct answer after each round: every name revealed so far, sorted."""
    return [sorted(name for r in rounds[: i + 1] for name in r) for i in range(len(rounds))]


def build_rows(games: list[list[list[str]]]) -> dict[str, list[Any]]:
    return {
        "question": [f"Sort these names alphabetically: {', '.join(game[0])}. {FORMAT}" for game in games],
        "answer": ["\n".join(expected_lists(game)[-1]) for game in games],
        "info": [{"rounds": game} for game in games],
    }


def parse_names(text: str | None) -> list[str]:
    """Names from a reply, one per line or comma separated, ignoring list bullets and numbering."""
    items = re.split(r"[\n,]", text or "")
    return [name for item in items if (name := re.sub(r"^\s*(?:[-*\u2022]|\d+[.)])?\s*", "", item).strip())]


def list_similarity(got: list[str], want: list[str]) -> float:
    """Matching-blocks ratio over whole names: order errors and missing names both cost."""
    return difflib.SequenceMatcher(None, got, want, autojunk=False).ratio() if got or want else 1.0


def per_turn_similarity(completion: list[dict[str, Any]], info: dict[str, Any]) -> float:
    """Mean over rounds of the similarity of that turn's list to the correct one; unanswered rounds score 0."""
    answers = [parse_names(m.get("content")) for m in completion if m.get("role") == "assistant"]
    targets = expected_lists(info["rounds"])
    return sum(list_similarity(got, want) for got, want in zip(answers, targets, strict=False)) / len(targets)


class AlphabetSortEnv(MultiTurnEnv):
    async def setup_state(self, state: State) -> None:
        state["expected"] = expected_lists(state.info["rounds"])
        state["answers"] = []

    async def env_response(self, messages: list[dict[str, Any]], state: State) -> list[dict[str, Any]]:
        state["answers"].append(parse_names(messages[-1].get("content")))
        new = state.info["rounds"][len(state["answers"])]
        text = f"Now also add: {', '.join(new)}. Give the full sorted list again. {FORMAT}"
        return [{"role": "user", "content": text}]

    @stop
    def all_rounds_answered(self, state: State) -> bool:
        answered = sum(m.get("role") == "assistant" for m in state.completion)
        return answered >= len(state.info["rounds"])


def load_environment(
    num_train: int = 1000,
    num_eval: int = 100,
    seed: int = 0,
    min_rounds: int = 2,
    max_rounds: int = 3,
    max_tokens: int = 128,
    **kwargs: Any,
) -> AlphabetSortEnv:
    from datasets import Dataset

    games = make_games(num_train + num_eval, seed, min_rounds, max_rounds)
    return AlphabetSortEnv(
        max_turns=max_rounds,
        dataset=lambda: Dataset.from_dict(build_rows(games[num_eval:])),
        eval_dataset=lambda: Dataset.from_dict(build_rows(games[:num_eval])),
        rubric=Rubric(funcs=[per_turn_similarity], weights=[1.0]),
        sampling_args={"max_tokens": max_tokens, **kwargs.pop("sampling_args", {})},
        **kwargs,
    )
