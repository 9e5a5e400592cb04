"""One id for the verl tests' environments (verl loads an environment by id inside its workers).

``kind``: ``single`` (single-turn, dense reward), ``two_turns`` (the environment answers once),
``tool`` (the add-tool conversation the fine-tuned tool model plays), ``raising`` (env_response
raises on the second turn).
"""

from __future__ import annotations

from typing import Any

import bridges_test_trl_envs as envs


class Raising(envs.TwoTurns):
    async def env_response(self, messages, state):
        raise RuntimeError("the game server is down")


def load_environment(kind: str = "single", **_: Any):
    if kind == "single":
        return envs.single_turn()
    if kind == "two_turns":
        return envs.two_turns()
    if kind == "tool":
        return envs.add_tool()
    if kind == "raising":
        env = envs.two_turns()
        return Raising(dataset=env.dataset, rubric=env.rubric, max_turns=2, sampling_args={"max_tokens": 8})
    raise ValueError(f"unknown kind {kind!r}")
