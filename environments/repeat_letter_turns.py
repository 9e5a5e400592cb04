"""The embedded default task over several turns, with feedback between them: multi-turn RL from scratch.

The model is shown a letter and answers; the environment replies with how many of the first
``length`` characters were right (``"4/6"``) and the model answers again, up to ``turns`` replies.
A reply that is right in full ends the episode (``solved``), so, as in real multi-turn tasks, the
episode's length tracks its outcome: the case where the backends' loss aggregation differs
(``trainer.loss_aggregation``). Each turn scores its reply with ``repeat_letter``'s dense reward and
a turn left unplayed because the letter was already repeated counts as right, so the reward (the
mean over ``turns``) rewards solving early and every turn carries signal from the first step. It is
download-free and the 2-layer tiny model learns it on a CPU in minutes, like the default:
``python -m bridges.train env=repeat_letter_turns``.
"""

from __future__ import annotations

from typing import Any

from bridges import ConfigError, MultiTurnEnv, Rubric, State, stop
from bridges.environments.repeat_letter import check_task, letter_splits


def reply_scores(completion: list[dict[str, Any]], answer: str, length: int) -> list[float]:
    """The fraction of each reply's first ``length`` characters equal to the letter."""
    replies = [m.get("content") or "" for m in completion if m.get("role") == "assistant"]
    return [sum(char == answer for char in reply[:length]) / length for reply in replies]


def make_turns_reward(turns: int, length: int):
    def repeated_over_turns(completion: list[dict[str, Any]], answer: str) -> float:
        """Mean over ``turns`` of each reply's score; the turns a solved episode did not need count 1."""
        scores = reply_scores(completion, answer, length)
        unplayed = turns - len(scores) if scores and scores[-1] == 1.0 else 0
        return (sum(scores) + unplayed) / turns

    return repeated_over_turns


class RepeatLetterTurnsEnv(MultiTurnEnv):
    def __init__(self, length: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.length = length

    async def env_response(self, messages: list[dict[str, Any]], state: State) -> list[dict[str, Any]]:
        """The score of the last reply, as "right/length": the feedback the next reply can use."""
        [score] = reply_scores(messages[-1:], state.answer, self.length)
        return [{"role": "user", "content": f"{round(score * self.length)}/{self.length}"}]

    @stop
    def solved(self, state: State) -> bool:
        scores = reply_scores(state.completion, state.answer, self.length)
        return bool(scores) and scores[-1] == 1.0


def load_environment(
    num_train: int = 512, num_eval: int = -1, seed: int = 0, alphabet: str = "abcdefgh", length: int = 6,
    turns: int = 3, **kwargs: Any,
) -> RepeatLetterTurnsEnv:
    check_task(alphabet, length)
    if turns < 1:
        raise ConfigError(f"turns must be at least 1, got {turns}.")
    return RepeatLetterTurnsEnv(
        length,
        max_turns=turns,
        **letter_splits(alphabet, num_train, num_eval, seed),
        rubric=Rubric(funcs=[make_turns_reward(turns, length)], weights=[1.0]),
        sampling_args={"max_tokens": length, **kwargs.pop("sampling_args", {})},
        **kwargs,
    )
