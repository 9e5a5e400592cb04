"""``VerifiersEnvironment``: a verifiers (Gen B, 0.1.8–0.3.x) environment behind our ``Environment``.

Rollouts run verifiers' own ``rollout`` (its loop, ``env_response``, stop conditions, tools) with our
``EngineClient``; verifiers 0.1.11+ wants its own client type, so the client is wrapped in
``vf.OpenAIChatCompletionsClient``, whose requests reach ``EngineClient``'s in-process transport.
verifiers' response types drop our token ids, so each rollout runs on a session of its own
(``bridges.agents``, reached in-process without a socket): every completion the session answered, in
order, becomes one of our ``Turn``s. Scoring calls the
verifiers rubric on the verifiers states, so group reward functions see the group; its reward
functions are guarded (``reward_guard``) so a raising one marks the rollout ``reward_error`` instead
of the 0.0 verifiers would score.
"""

from __future__ import annotations

import inspect
import time
from typing import Any

from bridges.adapters.verifiers.presign import presign_hooks
from bridges.adapters.verifiers.reward_guard import ERROR_KEY, guard
from bridges.agents.in_process import bound_client, bound_to
from bridges.agents.sessions import Sessions
from bridges.envs.base import Environment
from bridges.envs.messages import to_message_dicts
from bridges.envs.types import State, StopReason

VF_MAX_CALLS = 100_000
VF_MAX_TOKENS = 2**40

# verifiers' built-in stop conditions and the stop reasons they mean here; custom ones keep their name
_STOP_REASONS = {
    "has_error": StopReason.ENV_ERROR.value,
    "prompt_too_long": StopReason.PROMPT_TOO_LONG.value,
    "timeout_reached": StopReason.TIMEOUT.value,
    "max_turns_reached": StopReason.MAX_TURNS.value,
}


REWARD_TIMEOUT = 60.0  # seconds per reward call, as bridges.Rubric's default


class VerifiersRubric:
    """The face of a verifiers rubric that backends read (names and weights of the reward functions)."""

    def __init__(self, vf_rubric: Any, timeout: float = REWARD_TIMEOUT) -> None:
        self.vf_rubric = vf_rubric
        self.parser = getattr(vf_rubric, "parser", None)
        rubrics = getattr(vf_rubric, "rubrics", None) or [vf_rubric]  # a RubricGroup holds several
        for rubric in rubrics:  # so a raising reward is a reward_error here, not verifiers' silent 0.0
            rubric.funcs = [guard(f, timeout) for f in rubric.funcs]
        self._pairs = [
            (f.__name__, float(w)) for r in rubrics for f, w in zip(r.funcs, r.weights, strict=True)
        ]
        # 0.1.8-0.1.9: score_group(states, score_sem); worked out once, not per group
        self._takes_semaphore = len(inspect.signature(vf_rubric.score_group).parameters) >= 2

    def get_reward_func_names(self) -> list[str]:
        return [name for name, _ in self._pairs]

    def get_reward_weights(self) -> list[float]:
        return [weight for _, weight in self._pairs]

    async def score_group(self, states: list[State]) -> None:
        """Score with verifiers' rubric; each of our states must carry the verifiers state it came from."""
        natives = [s._native for s in states]
        if any(n is None for n in natives):
            raise ValueError("a verifiers rubric scores rollouts made by VerifiersEnvironment.rollout, each once "
                             "(the live verifiers state it reads is let go when scored).")
        started = time.perf_counter()
        score = self.vf_rubric.score_group
        if self._takes_semaphore:
            import asyncio

            await score(natives, asyncio.Semaphore(len(natives)))
        else:
            await score(natives)
        for state, native in zip(states, natives, strict=True):
            # Nothing reads the verifiers state after this. Kept, it would more than double what each
            # finished rollout holds (about 100 tracked objects a turn: its messages, responses, spans),
            # which the collector walks and the batch's memory carries until the step ends.
            state._native = None
            failure = native.get(ERROR_KEY)
            if failure and not state.errored:
                state.stop_reason, state.error = StopReason.REWARD_ERROR.value, failure
            if state.errored:
                state.reward = None
                continue
            state.reward = float(native.get("reward") or 0.0)
            state.metrics.update({k: float(v) for k, v in (native.get("metrics") or {}).items()})
            state.timing.scoring_s += time.perf_counter() - started


class VerifiersEnvironment(Environment):
    rescore_refusal = (
        "bridges.rescore cannot score traces of a verifiers environment again: its rubric reads the "
        "live verifiers state of each rollout, which a trace does not keep; run bridges.eval instead."
    )

    def __init__(
        self,
        vf_env: Any,
        *,
        env_id: str | None = None,
        env_args: dict[str, Any] | None = None,
        reward_timeout: float = REWARD_TIMEOUT,
    ) -> None:
        self.vf_env = vf_env
        self._sessions = Sessions()  # one per rollout, each closed when its rollout ends
        self._on_sessions: Any = None  # verifiers' client on the session bound to each rollout, built once
        super().__init__(
            dataset=(lambda: vf_env.get_dataset()) if getattr(vf_env, "dataset", None) is not None else None,
            eval_dataset=(lambda: vf_env.get_eval_dataset()),
            rubric=VerifiersRubric(vf_env.rubric, reward_timeout),  # type: ignore[arg-type]
            sampling_args=dict(getattr(vf_env, "sampling_args", None) or {}),
            env_id=env_id,
            env_args=env_args,
        )
        self.parser = getattr(vf_env, "parser", None) or self.parser
        presign_hooks(vf_env)
        import verifiers as vf

        from bridges.adapters.verifiers.support import version_tuple

        self._wants_task = version_tuple(str(getattr(vf, "__version__", "0"))) < (0, 1, 13)

    def _vf_client(self) -> Any:
        """verifiers' client over our sessions, built once (its wrapper costs more than a model call)."""
        if self._on_sessions is None:
            import verifiers as vf

            wrapper = getattr(vf, "OpenAIChatCompletionsClient", None)  # 0.1.11+; older take the raw client
            client = bound_client(self._sessions)
            self._on_sessions = wrapper(client) if wrapper is not None else client
        return self._on_sessions

    async def run_episode(
        self, row: dict[str, Any], state: State, client: Any, model: str, args: dict[str, Any]
    ) -> None:
        """verifiers' own rollout on a session of this rollout's (module doc)."""
        from bridges.envs.multiturn import turn_from_response

        vf_input = {
            "prompt": state.prompt,
            "answer": state.answer,
            "info": state.info,
            "example_id": state.example_id,
        }
        if self._wants_task:  # 0.1.8-0.1.12 required a task name; 0.3 refuses a plain string there
            vf_input["task"] = state.task
        # verifiers bounds its own turns, so the session's caps are set past any sane rollout
        session = self._sessions.open(
            client, model, args, max_calls=VF_MAX_CALLS, max_sampled_tokens=VF_MAX_TOKENS
        )
        session.declared_tools_only = False  # verifiers' ToolEnv answers a call to an unknown tool itself
        try:
            try:
                with bound_to(session):
                    native = await self.vf_env.rollout(vf_input, self._vf_client(), model, args)
            finally:
                self._sessions.close(session)
            state._native = native
            state.completion = to_message_dicts(native.get("completion") or [])
            state.turns = [turn_from_response(r) for r in session.responses]
            error = native.get("error")
            stop = native.get("stop_condition")
            if error is not None:
                state.error = (
                    f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else str(error)
                )
                state.stop_reason = _STOP_REASONS.get(stop, StopReason.ENV_ERROR.value)
            elif native.get("prompt_too_long"):
                state.stop_reason = StopReason.PROMPT_TOO_LONG.value
            else:
                state.stop_reason = _STOP_REASONS.get(stop, stop) or StopReason.COMPLETED.value
        except Exception as exc:  # verifiers records its own errors; this is a bug outside its loop
            state.stop_reason, state.error = StopReason.ENV_ERROR.value, f"{type(exc).__name__}: {exc}"
        drift = getattr(client, "measure_drift", None)
        if drift is not None and state.turns and not state.errored:
            measured = drift(state.messages)
            if measured is not None:
                state.drift_tokens, state.drifted_turns = measured

    async def score_group(self, states: list[State]) -> None:
        await self.rubric.score_group(states)
