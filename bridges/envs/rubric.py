"""Rubrics: weighted reward functions that ask for their inputs by parameter name.

A reward function that raises marks the rollout errored (``reward_error``) with the exception in one
sentence; it is never scored 0. A silent 0 would enter the group baseline as a real outcome and
teach the policy from an outage (verifiers' behaviour, which this library deliberately drops).
States that errored before scoring are not scored at all: their reward stays ``None``.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import numbers
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, overload

from bridges.envs.parsers import Parser
from bridges.envs.types import State, StopReason
from bridges.runtime.asyncutils import describe_exception
from bridges.runtime.errors import ConfigError
from bridges.runtime.usercode import CallCost, UserCodeTimeout, call_user

F = TypeVar("F", bound=Callable[..., Any])

GROUP_PARAMS = frozenset({"prompts", "completions", "answers", "states", "tasks", "infos", "example_ids"})
# what every rollout offers a reward function by name (beside the dataset row's columns and the
# rubric's class objects); one place, read by the calls below and by ``check_parameters``
ROLLOUT_PARAMS = frozenset({"prompt", "completion", "answer", "state", "info", "task", "example_id"})
_WEIGHT_ATTR = "__bridges_reward_weight__"


@overload
def reward(func: F, /) -> F: ...
@overload
def reward(*, weight: float = 1.0) -> Callable[[F], F]: ...
def reward(func: Any = None, /, *, weight: float = 1.0) -> Any:
    """Mark a reward function with its default weight: ``@reward`` or ``@reward(weight=0.5)``."""

    def mark(f: F) -> F:
        setattr(f, _WEIGHT_ATTR, float(weight))
        return f

    return mark(func) if func is not None else mark


def as_finite_reward(value: Any) -> float | None:
    """``value`` as a float when it is a real number (bools, numpy and 0-d torch scalars included)
    and finite; None for NaN, inf, strings and anything else."""
    if isinstance(value, str | bytes) or not (isinstance(value, numbers.Real) or hasattr(value, "__float__")):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def func_name(func: Callable[..., Any]) -> str:
    inner = getattr(func, "func", func)  # functools.partial
    return getattr(inner, "__name__", type(inner).__name__)


@dataclass(frozen=True, slots=True)
class _FuncInfo:
    """What a reward function asks for, computed once per function (signature inspection is slow)."""

    name: str
    params: tuple[str, ...]
    var_kw: bool
    is_group: bool


def _inspect(func: Callable[..., Any]) -> _FuncInfo:
    sig = inspect.signature(func)
    params = tuple(p.name for p in sig.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD))
    var_kw = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    ret = sig.return_annotation
    returns_list = ret is list or getattr(ret, "__origin__", None) is list
    if isinstance(ret, str):
        returns_list = ret.replace(" ", "").startswith(("list", "List"))
    is_group = returns_list or any(p in GROUP_PARAMS for p in params)
    return _FuncInfo(func_name(func), params, var_kw, is_group)


class Rubric:
    """Weighted reward functions; ``reward = sum(weight * value)``, ``metrics[name] = value``.

    ``timeout`` bounds each reward call. Sync functions run on a worker thread so the bound holds even
    for one that hangs (the thread is abandoned, the rollout marked errored); one function runs at a
    time per state, but calls for different states of a group may run on parallel threads. A sync
    function whose first calls all took under a millisecond is then called on the event loop's
    thread, under the hooks' watchdog (``bridges.runtime.usercode.CallCost``: the thread hop cost more than
    the function); ``inline_cheap=False`` keeps every call on a thread.
    """

    def __init__(
        self,
        funcs: Sequence[Callable[..., Any]] | None = None,
        weights: Sequence[float] | None = None,
        parser: Parser | None = None,
        *,
        timeout: float = 60.0,
        inline_cheap: bool = True,
    ) -> None:
        funcs = list(funcs or [])
        if weights is not None and len(weights) != len(funcs):
            raise ConfigError(
                f"Rubric got {len(funcs)} reward functions but {len(weights)} weights; give one weight per function."
            )
        self.parser = parser if parser is not None else Parser()
        self.timeout = timeout
        self.inline_cheap = inline_cheap
        self._costs: dict[int, CallCost] = {}
        self.funcs: list[Callable[..., Any]] = []
        self.weights: list[float] = []
        self._info: dict[int, _FuncInfo] = {}
        self.class_objects: dict[str, Any] = {"parser": self.parser}
        for i, func in enumerate(funcs):
            self.add_reward_func(func, None if weights is None else weights[i])

    # --- registration -------------------------------------------------------------------------
    def add_reward_func(self, func: Callable[..., Any], weight: float | None = None) -> None:
        """Register ``func``; its weight is ``weight``, else its ``@reward`` weight, else 1.0."""
        if not callable(func):
            raise ConfigError(f"a reward function must be callable, got {type(func).__name__}.")
        if weight is None:
            weight = getattr(func, _WEIGHT_ATTR, 1.0)
        self.funcs.append(func)
        self.weights.append(float(weight))
        self._info[id(func)] = _inspect(func)
        self._costs[id(func)] = CallCost()

    def add_metric(self, func: Callable[..., Any], weight: float = 0.0) -> None:
        """A metric is a reward function that is recorded but does not count (weight 0)."""
        self.add_reward_func(func, weight)

    def add_class_object(self, name: str, obj: Any) -> None:
        """Make ``obj`` injectable into reward functions under the parameter name ``name``."""
        self.class_objects[name] = obj
        if name == "parser":
            self.parser = obj

    def get_reward_funcs(self) -> list[Callable[..., Any]]:
        return list(self.funcs)

    def check_parameters(self, columns: Sequence[str]) -> None:
        """Every parameter a reward function needs (no default) is one a call can pass: a rollout's
        inputs and ``columns`` (the dataset's), or a group's lists. A misnamed one would otherwise
        fail every rollout's scoring at run time, after a dry run passed."""
        for func in self.funcs:
            info = self._info[id(func)]
            offered = (GROUP_PARAMS if info.is_group else ROLLOUT_PARAMS | set(columns)) | set(self.class_objects)
            params = inspect.signature(func).parameters.values()
            needed = [p.name for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
            unknown = [name for name in needed if name not in offered]
            if unknown:
                raise ConfigError(
                    f"reward function '{info.name}' asks for {', '.join(repr(n) for n in unknown)}, which no "
                    f"{'group' if info.is_group else 'rollout'} provides; it can ask for {', '.join(sorted(offered))}."
                )

    def get_reward_func_names(self) -> list[str]:
        return [self._info[id(f)].name for f in self.funcs]

    def get_reward_weights(self) -> list[float]:
        return list(self.weights)

    # --- calling ------------------------------------------------------------------------------
    def _rollout_args(self, state: State) -> dict[str, Any]:
        return {
            **state.row,
            **self.class_objects,
            "prompt": state.prompt,
            "completion": state.completion,
            "answer": state.answer,
            "state": state,
            "info": state.info,
            "task": state.task,
            "example_id": state.example_id,
        }

    def _group_args(self, states: list[State]) -> dict[str, Any]:
        return {
            **self.class_objects,
            "prompts": [s.prompt for s in states],
            "completions": [s.completion for s in states],
            "answers": [s.answer for s in states],
            "states": states,
            "infos": [s.info for s in states],
            "tasks": [s.task for s in states],
            "example_ids": [s.example_id for s in states],
        }

    async def _call(self, func: Callable[..., Any], available: dict[str, Any]) -> Any:
        info = self._info[id(func)]
        kwargs = available if info.var_kw else {k: available[k] for k in info.params if k in available}
        cost = self._costs[id(func)] if self.inline_cheap else None
        return await call_user(
            func, timeout=self.timeout, what=f"reward function '{info.name}'", cost=cost, **kwargs
        )

    @staticmethod
    def _failure(name: str, exc: BaseException) -> str:
        if isinstance(exc, UserCodeTimeout):
            return f"reward function '{name}' raised TimeoutError: {exc}"
        return f"reward function '{name}' raised {describe_exception(exc)}"

    @staticmethod
    def _mark_failed(state: State, sentence: str) -> None:
        if state.error is None:  # keep the first failure: it is the cause
            state.stop_reason = StopReason.REWARD_ERROR.value
            state.error = sentence

    @staticmethod
    def _finish(state: State, values: dict[str, float], total: float) -> None:
        state.metrics.update(values)
        state.reward = None if state.error is not None else float(total)

    # --- scoring ------------------------------------------------------------------------------
    async def score_rollout(self, state: State) -> None:
        """Score one rollout in place (group functions see a group of one)."""
        await self.score_group([state])

    async def score_group(self, states: Sequence[State]) -> None:
        """Score a group in place; group functions see the lists over the group's valid states only."""
        states = list(states)
        started = time.perf_counter()
        valid = [s for s in states if not s.errored]
        for s in states:
            if s.errored:
                s.reward = None
        if not valid:
            return
        values: list[dict[str, float]] = [{} for _ in valid]
        totals = [0.0] * len(valid)
        for func, weight in zip(self.funcs, self.weights, strict=True):
            info = self._info[id(func)]
            if info.is_group:
                scores = await self._score_group_func(func, info, valid)
            else:
                results = await asyncio.gather(
                    *(self._call(func, self._rollout_args(s)) for s in valid), return_exceptions=True
                )
                scores = [self._value(state, info.name, r) for state, r in zip(valid, results, strict=True)]
            for i, score in enumerate(scores):
                if score is not None:
                    values[i][info.name] = score
                    totals[i] += weight * score
        elapsed = time.perf_counter() - started
        for state, vals, total in zip(valid, values, totals, strict=True):
            self._finish(state, vals, total)
            state.timing.scoring_s += elapsed

    async def _score_group_func(
        self, func: Callable[..., Any], info: _FuncInfo, valid: list[State]
    ) -> list[float | None]:
        try:
            result = await self._call(func, self._group_args(valid))
            values = list(result)
            if len(values) != len(valid):
                raise ValueError(
                    f"it returned {len(values)} values for a group of {len(valid)} valid rollouts"
                )
        except Exception as exc:  # recorded on every state of the group, never swallowed as 0
            for state in valid:
                self._mark_failed(state, self._failure(info.name, exc))
            return [None] * len(valid)
        return [self._value(state, info.name, value) for state, value in zip(valid, values, strict=True)]

    def _value(self, state: State, name: str, result: Any) -> float | None:
        """The reward as a finite float, or None with the rollout marked ``reward_error``.

        A NaN or inf would pass into the group baseline and the loss and turn every weight into NaN;
        a string such as "0.5" is a bug in the reward function, not a score.
        """
        if isinstance(result, asyncio.CancelledError):
            raise result
        if isinstance(result, BaseException):
            self._mark_failed(state, self._failure(name, result))
            return None
        value = as_finite_reward(result)
        if value is None:
            self._mark_failed(
                state, f"reward function '{name}' returned {result!r:.80}, which is not a finite number."
            )
        return value
