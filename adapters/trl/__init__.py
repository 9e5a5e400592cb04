"""TRL 1.16 adapter: any environment inside an existing ``GRPOTrainer`` script.

    from bridges.adapters.trl import trl_trainer_kwargs
    trainer = GRPOTrainer(model=model, args=GRPOConfig(...), **trl_trainer_kwargs("guess_number"))

Single-turn environments let TRL generate and score through ``trl_reward_funcs``; multi-turn and
tool environments add ``trl_rollout_func``, which runs the rollouts token-exactly through an
``EngineClient`` over TRL's own generation. Importing this package does not import TRL.
"""

from __future__ import annotations

from typing import Any, cast

from bridges.adapters.trl.dataset import ROW_KEY, RowIndex, trl_dataset
from bridges.adapters.trl.rewards import SCORES_KEY, trl_reward_funcs
from bridges.adapters.trl.rollout import trl_rollout_func
from bridges.envs.base import Environment


def needs_rollout_func(env: Environment) -> bool:
    """Whether TRL's own single-turn generation cannot run ``env`` (it has more than one model turn)."""
    from bridges.envs.singleturn import SingleTurnEnv

    return not isinstance(env, SingleTurnEnv)


def trl_trainer_kwargs(
    env: Environment | str, num_generations: int | None = None, sampling_args: dict[str, Any] | None = None
) -> dict[str, Any]:
    """``train_dataset``, ``eval_dataset``, ``reward_funcs`` and, when needed, ``rollout_func`` for ``env``
    (an environment, or an id for ``bridges.load_environment``); ``sampling_args`` as ``trl_rollout_func``'s."""
    if isinstance(env, str):
        from bridges.envs.registry import load_environment

        env = cast(Environment, load_environment(env))
    kwargs: dict[str, Any] = {
        "train_dataset": trl_dataset(env, "train"),
        "reward_funcs": trl_reward_funcs(env, num_generations),
    }
    if env.eval_dataset is not None:
        kwargs["eval_dataset"] = trl_dataset(env, "eval")
    if needs_rollout_func(env):
        kwargs["rollout_func"] = trl_rollout_func(env, sampling_args=sampling_args)
    return kwargs


__all__ = [
    "ROW_KEY",
    "SCORES_KEY",
    "RowIndex",
    "needs_rollout_func",
    "trl_dataset",
    "trl_reward_funcs",
    "trl_rollout_func",
    "trl_trainer_kwargs",
]
