"""Guess a secret integer; the environment answers "higher", "lower" or "correct" (multi-turn).

The smallest interesting interactive task: the policy must use the feedback of earlier turns
(binary search wins), the episode ends early when it is solved, and the reward separates
"solved fast" from "solved eventually" while a weight-0 closeness metric shows progress on the way.
"""

from __future__ import annotations

import random
import re
from typing import Any

from bridges import ConfigError, MultiTurnEnv, Rubric, State, stop

WIDTHS = (10, 20, 50, 100)
NO_NUMBER_HINT = "Please answer with a single integer between {low} and {high}."


def make_games(count: int, seed: int) -> list[dict[str, int]]:
    """``count`` distinct (low, high, secret) games, so the train and eval splits never share one."""
    rng = random.Random(seed)
    games: dict[tuple[int, int, int], None] = {}
    for _ in range(count * 50):
        if len(games) == count:
            break
        low = rng.randint(0, 100)
        high = low + rng.choice(WIDTHS)
        games.setdefault((low, high, rng.randint(low, high)))
    if len(games) < count:
        raise ConfigError(f"cannot generate {count} distinct games; ask for fewer rows.")
    return [{"low": low, "high": high, "secret": secret} for low, high, secret in games]


def build_rows(games: list[dict[str, int]], max_turns: int) -> dict[str, list[Any]]:
    return {
        "question": [
            f"I am thinking of an integer between {g['low']} and {g['high']}. You have {max_turns} guesses; "
            "after each I say higher, lower or correct. Answer with just your guess."
            for g in games
        ],
        "answer": [str(g["secret"]) for g in games],
        "info": [{**g, "max_turns": max_turns} for g in games],
    }


def parse_guess(text: str | None) -> int | None:
    """The last integer in a message: models often restate the range before guessing."""
    numbers = re.findall(r"-?\d+", text or "")
    return int(numbers[-1]) if numbers else None


def guesses(completion: list[dict[str, Any]]) -> list[int | None]:
    return [parse_guess(m.get("content")) for m in completion if m.get("role") == "assistant"]


def solved_reward(completion: list[dict[str, Any]], info: dict[str, Any]) -> float:
    """1.0 for solving on the first guess, falling linearly to 0.5 on the last allowed guess; 0 unsolved."""
    made = guesses(completion)
    if info["secret"] not in made:
        return 0.0
    used, allowed = made.index(info["secret"]) + 1, max(int(info["max_turns"]), 1)
    return 1.0 if allowed == 1 else 1.0 - 0.5 * (used - 1) / (allowed - 1)


def closeness(completion: list[dict[str, Any]], info: dict[str, Any]) -> float:
    """Metric: 1 - distance of the last valid guess to the secret / range width (0 with no guess)."""
    made = [g for g in guesses(completion) if g is not None]
    if not made:
        return 0.0
    return max(0.0, 1.0 - abs(made[-1] - info["secret"]) / (info["high"] - info["low"]))


class GuessNumberEnv(MultiTurnEnv):
    async def setup_state(self, state: State) -> None:
        state["feedback"] = []

    async def env_response(self, messages: list[dict[str, Any]], state: State) -> list[dict[str, Any]]:
        info = state.info
        guess = parse_guess(messages[-1].get("content"))
        if guess is None:
            reply = NO_NUMBER_HINT.format(low=info["low"], high=info["high"])
        else:
            reply = "higher" if guess < info["secret"] else "lower" if guess > info["secret"] else "correct"
        state["feedback"].append(reply)
        return [{"role": "user", "content": reply}]

    @stop
    def solved(self, state: State) -> bool:
        """Checked on the model's last message itself, so it holds before any env_response runs."""
        made = guesses(state.completion)
        return bool(made) and made[-1] == state.info["secret"]


def load_environment(
    num_train: int = 1000,
    num_eval: int = 100,
    seed: int = 0,
    max_turns: int = 8,
    max_tokens: int = 32,
    **kwargs: Any,
) -> GuessNumberEnv:
    from datasets import Dataset

    games = make_games(num_train + num_eval, seed)
    return GuessNumberEnv(
        max_turns=max_turns,
        dataset=lambda: Dataset.from_dict(build_rows(games[num_eval:], max_turns)),
        eval_dataset=lambda: Dataset.from_dict(build_rows(games[:num_eval], max_turns)),
        rubric=Rubric(funcs=[solved_reward, closeness], weights=[1.0, 0.0]),
        sampling_args={"max_tokens": max_tokens, **kwargs.pop("sampling_args", {})},
        **kwargs,
    )
