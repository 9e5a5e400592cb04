"""Keep what verifiers' rubric throws away: a reward function that raised, hung or returned no number.

verifiers (0.1.8-0.3.x) catches an exception from a reward function, logs it and scores 0.0, so the
rollout enters the group baseline as a fake zero and the policy learns from an outage. This module
wraps each function of a verifiers rubric before verifiers sees it. The wrapper keeps the function's
name and parameters (verifiers reads both: the name for metrics, the parameters to find group
functions and to pick its arguments), adds a ``**kwargs`` so verifiers hands it the rollout's
``state`` (or the group's ``states``), and calls the function through ``bridges.runtime.usercode``, bounded.
A failure is written into the verifiers state under ``ERROR_KEY`` and re-raised for verifiers to
log; ``VerifiersRubric`` then marks that rollout ``reward_error`` exactly as the native rubric does.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from bridges.envs.rubric import as_finite_reward
from bridges.runtime.asyncutils import describe_exception
from bridges.runtime.usercode import CallCost, UserCodeTimeout, call_user

ERROR_KEY = "bridges_reward_error"
_MARK = "__bridges_guarded__"


def _record(state: Any, sentence: str) -> None:
    """Keep the first failure on a verifiers state (a dict): it is the cause."""
    if isinstance(state, dict) and not state.get(ERROR_KEY):
        state[ERROR_KEY] = sentence


def guard(func: Callable[..., Any], timeout: float) -> Callable[..., Any]:
    """``func`` as verifiers should have called it: bounded, with failures kept on the state(s)."""
    if getattr(func, _MARK, False):
        return func
    signature = inspect.signature(func)
    params = signature.parameters
    takes_all = any(p.kind is p.VAR_KEYWORD for p in params.values())
    name = getattr(func, "__name__", type(func).__name__)
    cost = CallCost()  # a cheap sync function stops paying the thread hop (see bridges.runtime.usercode)

    @functools.wraps(func)
    async def guarded(**kwargs: Any) -> Any:
        states = kwargs.get("states") or ([kwargs["state"]] if "state" in kwargs else [])
        args = kwargs if takes_all else {k: v for k, v in kwargs.items() if k in params}
        try:
            result = await call_user(
                func, timeout=timeout, what=f"reward function '{name}'", cost=cost, **args
            )
        except Exception as exc:
            detail = f"TimeoutError: {exc}" if isinstance(exc, UserCodeTimeout) else describe_exception(exc)
            for state in states:
                _record(state, f"reward function '{name}' raised {detail}")
            raise
        values = result if isinstance(result, list | tuple) and "states" in kwargs else [result]
        for state, value in zip(states, values, strict=False):
            if as_finite_reward(value) is None:
                _record(
                    state, f"reward function '{name}' returned {value!r:.80}, which is not a finite number."
                )
        return result

    extra = [] if takes_all else [inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)]
    guarded.__signature__ = signature.replace(parameters=[*params.values(), *extra])  # type: ignore[attr-defined]
    setattr(guarded, _MARK, True)
    return guarded
