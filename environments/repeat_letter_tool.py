"""The embedded default task with a tool: full reward needs a call to ``letter`` before the answer.

The prompt shows a letter and offers one tool, ``letter()``, that returns it. The first reply should
call the tool; the reply after the tool's answer is scored with ``repeat_letter``'s dense reward. The
reward is half for having called the tool first and half for the final reply, so a model that
answers at once (which ends a ``ToolEnv`` episode) gets at most half.

One departure from ``ToolEnv``'s dispatch, and why: a randomly initialised character-level model can
emit the ``<tool_call>`` marker (one token of the tiny vocabulary) long before it can spell a JSON
call, so here every call reaches the one tool whatever name and arguments it carries. A real task
keeps ``ToolEnv``'s "Error: ..." replies to bad calls. Download-free; the 2-layer tiny model learns
it on a CPU in minutes: ``python -m bridges.train env=repeat_letter_tool``.
"""

from __future__ import annotations

from typing import Any

from bridges import ConfigError, Rubric, State, ToolEnv
from bridges.environments.repeat_letter import check_task, letter_splits, make_repeat_reward


def letter() -> str:
    """The letter to repeat."""
    raise AssertionError("answered by RepeatLetterToolEnv.call_tool, which knows the rollout's letter")


def called_first(completion: list[dict[str, Any]]) -> bool:
    replies = [m for m in completion if m.get("role") == "assistant"]
    return bool(replies) and bool(replies[0].get("tool_calls"))


def make_tool_reward(length: int):
    repeated = make_repeat_reward(length)

    def called_then_repeated(completion: list[dict[str, Any]], answer: str) -> float:
        """Half for a tool call in the first reply, half for the last reply's repeated letter."""
        replies = [m for m in completion if m.get("role") == "assistant"]
        final = [{"role": "assistant", "content": replies[-1].get("content") or ""}] if replies else []
        return 0.5 * called_first(completion) + 0.5 * repeated(final, answer)

    return called_then_repeated


class RepeatLetterToolEnv(ToolEnv):
    async def call_tool(self, name: str, arguments: Any, state: State) -> str:
        """Every call is the one tool's (see the module docstring); it answers with the rollout's letter."""
        state.metrics["tool_calls"] = state.metrics.get("tool_calls", 0.0) + 1
        return state.answer


def load_environment(
    num_train: int = 512, num_eval: int = -1, seed: int = 0, alphabet: str = "abcdefgh", length: int = 6,
    max_turns: int = 2, **kwargs: Any,
) -> RepeatLetterToolEnv:
    check_task(alphabet, length)
    if max_turns < 2:
        raise ConfigError(f"max_turns must be at least 2 (a call, then the answer), got {max_turns}.")
    return RepeatLetterToolEnv(
        tools=[letter],
        max_turns=max_turns,
        **letter_splits(alphabet, num_train, num_eval, seed),
        rubric=Rubric(funcs=[make_tool_reward(length)], weights=[1.0]),
        sampling_args={"max_tokens": length, **kwargs.pop("sampling_args", {})},
        **kwargs,
    )
