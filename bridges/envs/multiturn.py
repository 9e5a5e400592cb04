"""The rollout loop: model turn, environment response, stop conditions, with every failure recorded.

A rollout never raises for an environment, engine or timeout failure: it ends with a stop reason and
a one-sentence error, and keeps what it produced, because a training group must survive one bad
member (it is masked, not dropped) and an evaluation must not lose finished work.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, overload

from bridges.envs.base import Environment
from bridges.envs.messages import read_field, to_message_dict, to_message_dicts
from bridges.envs.types import Messages, State, StopReason, Turn
from bridges.runtime.asyncutils import backoff_delay, describe_exception, maybe_await
from bridges.runtime.deadlines import Deadline
from bridges.runtime.errors import PromptTooLongError
from bridges.runtime.usercode import call_user

F = TypeVar("F", bound=Callable[..., Any])
_STOP_ATTR = "__bridges_stop__"
_STOP_CACHE: dict[type, tuple[_StopSpec, ...]] = {}
_TRANSIENT: tuple[type[BaseException], ...] | None = None


@dataclass(frozen=True, slots=True)
class _StopSpec:
    attr: str
    reason: str
    priority: int
    ours: bool  # defined in this library: cheap and known to return, so called inline, not bounded


@overload
def stop(func: F, /) -> F: ...
@overload
def stop(*, priority: int = 0, reason: str | None = None) -> Callable[[F], F]: ...
def stop(func: Any = None, /, *, priority: int = 0, reason: str | None = None) -> Any:
    """Mark a method ``(self, state) -> bool`` (sync or async) as a stop condition.

    Higher ``priority`` is checked first, ties by name; the recorded stop reason is the method name
    unless ``reason`` is given.
    """

    def mark(f: F) -> F:
        setattr(f, _STOP_ATTR, (priority, reason or f.__name__))
        return f

    return mark(func) if func is not None else mark


def stop_conditions(cls: type) -> tuple[_StopSpec, ...]:
    """The stop conditions of a class, found once by inspection and cached."""
    specs = _STOP_CACHE.get(cls)
    if specs is None:
        found = []
        for attr, member in inspect.getmembers(cls):
            mark = getattr(member, _STOP_ATTR, None)
            if mark is not None:
                ours = getattr(member, "__module__", "").startswith("bridges.")
                found.append(_StopSpec(attr, mark[1], mark[0], ours))
        specs = tuple(sorted(found, key=lambda s: (-s.priority, s.attr)))
        _STOP_CACHE[cls] = specs
    return specs


class _Abort(Exception):
    """Ends the loop with an error stop reason; never leaves ``rollout``."""

    def __init__(self, reason: str, error: str) -> None:
        super().__init__(error)
        self.reason, self.error = reason, error


def _transient_errors() -> tuple[type[BaseException], ...]:
    global _TRANSIENT
    if _TRANSIENT is None:
        import openai

        _TRANSIENT = (
            openai.APIConnectionError,  # includes APITimeoutError
            openai.RateLimitError,
            openai.InternalServerError,
            asyncio.TimeoutError,
        )
    return _TRANSIENT


def _is_prompt_too_long(exc: BaseException) -> bool:
    if isinstance(exc, PromptTooLongError):
        return True
    text = str(exc).lower()
    return (
        getattr(exc, "code", None) == "prompt_too_long"
        or "maximum context length" in text
        or "prompt is too long" in text
    )


def turn_from_response(response: Any) -> Turn:
    """A Turn from a chat completion: token ids and logprobs from the response extras when present."""
    choices = read_field(response, "choices")
    if not choices:
        raise _Abort(StopReason.ENGINE_ERROR.value, "EngineError: the model returned no choices.")
    choice = choices[0]
    logprobs = read_field(choice, "token_logprobs")
    if logprobs is None:
        content = (
            read_field(read_field(choice, "logprobs"), "content") if read_field(choice, "logprobs") else None
        )
        logprobs = [read_field(entry, "logprob") for entry in content] if content else []
    return Turn(
        prompt_ids=list(read_field(response, "prompt_token_ids") or []),
        completion_ids=list(read_field(choice, "token_ids") or []),
        logprobs=[float(x) for x in logprobs],
        finish_reason=read_field(choice, "finish_reason"),
        weight_version=read_field(response, "weight_version"),
        message=to_message_dict(read_field(choice, "message")),
    )


def _env_messages(reply: Any) -> list[dict[str, Any]]:
    """Normalise what ``env_response`` returned: a list of messages, one message, or (messages, state)."""
    if isinstance(reply, tuple) and len(reply) == 2:  # verifiers Gen A returned (messages, state)
        reply = reply[0]
    if reply is None:
        return []
    if isinstance(reply, dict) or hasattr(reply, "role"):
        return [to_message_dict(reply)]
    if isinstance(reply, str) or not isinstance(reply, (list, tuple)):
        raise TypeError(f"env_response must return a list of messages, got {type(reply).__name__}.")
    return to_message_dicts(reply)


class MultiTurnEnv(Environment):
    """Alternates model turns and ``env_response`` until a ``@stop`` condition fires.

    Loop: check stops -> if a model turn happened, append ``env_response`` -> check stops -> model call.
    Transient engine errors are retried ``max_retries`` times here; a plain ``openai.AsyncOpenAI`` also
    retries on its own (its ``max_retries``, 2 by default), so the attempts multiply.
    """

    tool_defs: list[dict[str, Any]] | None = None  # OpenAI tool schemas sent with every model call

    def __init__(self, max_turns: int = -1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.max_turns = max_turns

    async def setup_state(self, state: State) -> None:
        """Hook: prepare per-rollout state before the first model call."""

    async def env_response(self, messages: Messages, state: State) -> Messages:
        """Hook: the environment's reply to the last model turn (mutate ``state`` in place)."""
        raise NotImplementedError(f"{type(self).__name__} must implement env_response(messages, state).")

    @stop(reason=StopReason.MAX_TURNS.value)
    def max_turns_reached(self, state: State) -> bool:
        return self.max_turns > 0 and len(state.turns) >= self.max_turns

    def tools_for(self, state: State) -> list[dict[str, Any]] | None:
        """Tools offered to the model: a row's ``info["tool_defs"]`` overrides the environment's."""
        return state.info.get("tool_defs") or self.tool_defs

    async def is_completed(self, state: State) -> bool:
        """Run the stop conditions in order; the first that fires records its reason."""
        if state.error is not None:
            raise _Abort(state.stop_reason or StopReason.ENV_ERROR.value, state.error)
        for spec in stop_conditions(type(self)):
            try:
                check = getattr(self, spec.attr)
                fired = (
                    await maybe_await(check(state))
                    if spec.ours
                    else await self._hook(check, state, what=f"stop condition '{spec.attr}'")
                )
            except Exception as exc:
                raise _Abort(
                    StopReason.ENV_ERROR.value,
                    f"stop condition '{spec.attr}' raised {describe_exception(exc)}",
                ) from exc
            if fired:
                state.stop_reason = spec.reason
                return True
        return False

    async def run_episode(
        self, row: dict[str, Any], state: State, client: Any, model: str, args: dict[str, Any]
    ) -> None:
        """The loop of model turns and ``env_response``s; failures end it with a stop reason and
        ``state.error``, never an exception."""
        try:
            if self.rollout_timeout is not None:
                await asyncio.wait_for(self._loop(state, client, model, args), self.rollout_timeout)
            else:
                await self._loop(state, client, model, args)
        except _Abort as abort:
            state.stop_reason, state.error = abort.reason, abort.error
        except TimeoutError:
            self.mark_timed_out(state)
        except Exception as exc:  # a bug in a subclass's own loop code
            state.stop_reason = StopReason.ENV_ERROR.value
            state.error = f"the rollout raised {describe_exception(exc)}"
        await self._measure_drift(state, client)

    async def _loop(self, state: State, client: Any, model: str, args: dict[str, Any]) -> None:
        try:
            await self._hook(self.setup_state, state, what="setup_state")
        except Exception as exc:
            raise _Abort(StopReason.ENV_ERROR.value, f"setup_state raised {describe_exception(exc)}") from exc
        while True:
            if await self.is_completed(state):
                return
            if state.turns:
                try:
                    reply = await self._hook(self.env_response, state.messages, state, what="env_response")
                    state.completion.extend(_env_messages(reply))
                except Exception as exc:
                    raise _Abort(
                        StopReason.ENV_ERROR.value, f"env_response raised {describe_exception(exc)}"
                    ) from exc
                if await self.is_completed(state):
                    return
            await self._model_turn(state, client, model, args)

    async def _hook(self, hook: Any, *args: Any, what: str) -> Any:
        """An environment hook bounded by ``hook_timeout`` (sync hooks on the loop, under the watchdog)."""
        return await call_user(hook, *args, timeout=self.hook_timeout, what=what, inline=True)

    async def _model_turn(self, state: State, client: Any, model: str, args: dict[str, Any]) -> None:
        kwargs = dict(args)
        tools = self.tools_for(state)
        if tools:
            kwargs["tools"] = tools
        started = time.perf_counter()
        try:
            response = await self._call_model(client, model, state.messages, kwargs)
        finally:
            state.timing.generation_s += time.perf_counter() - started
        try:
            turn = turn_from_response(response)
        except _Abort:
            raise
        except Exception as exc:  # a malformed response is the engine's fault, not the environment's
            raise _Abort(
                StopReason.ENGINE_ERROR.value,
                f"the model response was malformed ({describe_exception(exc)}).",
            ) from exc
        state.turns.append(turn)
        state.completion.append(dict(turn.message))
        usage = read_field(response, "usage")
        if usage is not None:
            totals = state.extras.setdefault("usage", {"prompt_tokens": 0, "completion_tokens": 0})
            totals["prompt_tokens"] += int(read_field(usage, "prompt_tokens") or 0)
            totals["completion_tokens"] += int(read_field(usage, "completion_tokens") or 0)

    async def _call_model(self, client: Any, model: str, messages: Messages, kwargs: dict[str, Any]) -> Any:
        """``chat.completions.create`` bounded by ``model_timeout``, transient errors retried with backoff."""
        import openai

        transient = _transient_errors()
        attempts = self.max_retries + 1
        last: BaseException | None = None
        for attempt in range(attempts):
            try:
                with Deadline(self.model_timeout):  # asyncio.wait_for would start a task per call
                    return await client.chat.completions.create(model=model, messages=messages, **kwargs)
            except (openai.BadRequestError, PromptTooLongError) as exc:
                reason = StopReason.PROMPT_TOO_LONG if _is_prompt_too_long(exc) else StopReason.ENGINE_ERROR
                raise _Abort(reason.value, describe_exception(exc)) from exc
            except transient as exc:
                last = exc
                if attempt + 1 < attempts:
                    await asyncio.sleep(backoff_delay(attempt, self.retry_base_delay, self.retry_max_delay))
            except Exception as exc:
                if _is_prompt_too_long(exc):
                    raise _Abort(StopReason.PROMPT_TOO_LONG.value, describe_exception(exc)) from exc
                raise _Abort(StopReason.ENGINE_ERROR.value, describe_exception(exc)) from exc
        assert last is not None
        what = (
            f"TimeoutError: no response within model_timeout={self.model_timeout} s"
            if isinstance(last, asyncio.TimeoutError)
            else describe_exception(last)
        )
        raise _Abort(
            StopReason.ENGINE_ERROR.value, f"the model call failed after {attempts} attempts ({what})."
        )

    async def _measure_drift(self, state: State, client: Any) -> None:
        await measure_drift(state, client, state.messages, self.model_timeout)


async def measure_drift(state: State, client: Any, messages: list[dict[str, Any]], timeout: float) -> None:
    """Ask the client how far the recorded tokens of ``messages`` (up to their last reply) drifted from
    a fresh render, into ``state`` (never fails the rollout; a client without a ledger has no answer)."""
    measure = getattr(client, "measure_drift", None)
    if measure is None or not callable(measure) or not state.turns:
        return
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
    if last < 0:
        return
    try:
        result = measure(messages[: last + 1])
        if inspect.isawaitable(result):
            result = await asyncio.wait_for(result, timeout)
        if result is not None:
            state.drift_tokens, state.drifted_turns = int(result[0]), int(result[1])
    except Exception as exc:
        state.extras["drift_error"] = describe_exception(exc)
