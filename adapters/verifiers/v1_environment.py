"""``V1Environment``: a verifiers v1 taskset (and its ``Env``, if it has one) behind our ``Environment``.

Each rollout is one verifiers episode run by verifiers' own machinery — ``Env.serving``,
``Env.run_slot``, the task's hooks and ``@vf.reward``/``@vf.metric`` scoring, its interception
server — with every model call answered by the backend's ``EngineClient`` on a loopback endpoint
that records the sampled ids per rollout (``v1_endpoint``). Agents on verifiers' ``null`` harness run
in this process (``v1_seat``). The trace's reward is the rollout's reward; its errors mask it.

Supported here: single-agent tasksets (``SingleAgentEnv``) on the null harness, chat dialect, without
MCP toolsets. A taskset whose ``Env`` declares several agents, or that declares a toolset, is refused
in one sentence when it loads.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import time
from typing import Any

from bridges.adapters.verifiers.v1_endpoint import SessionEndpoint
from bridges.envs.base import Environment
from bridges.envs.messages import to_message_dicts
from bridges.envs.types import State, StopReason
from bridges.runtime.errors import ConfigError

MAX_TASKS = 100_000  # an infinite taskset is read this far
EPISODE_TIMEOUT = 600.0  # seconds: verifiers sets no limit by default; env_args.timeout.* sets its own


class EpisodeFailed(Exception):
    """verifiers ended the episode with errors and no trace (its ``run()`` raised or timed out)."""

    def __init__(self, error: Any) -> None:
        super().__init__(f"{error.type}: {error.message}")
        self.timed_out = error.type == "TimeoutError"


class V1Rubric:
    """The face of a taskset's rewards that backends read; verifiers scores inside each episode."""

    def __init__(self, pairs: list[tuple[str, float]]) -> None:
        self._pairs = pairs
        self.parser = None

    def get_reward_func_names(self) -> list[str]:
        return [name for name, _ in self._pairs]

    def get_reward_weights(self) -> list[float]:
        return [weight for _, weight in self._pairs]

    async def score_group(self, states: list[State]) -> None:
        """Nothing to do: each state's reward is its trace's, computed by verifiers when it ended."""


class V1Environment(Environment):
    rescore_refusal = (
        "bridges.rescore cannot score traces of a verifiers v1 taskset again: verifiers scores each "
        "episode's live trace when it ends; run bridges.eval instead."
    )

    def __init__(self, vf_env: Any, *, taskset_id: str, env_args: dict[str, Any]) -> None:
        from datasets import Dataset

        self.vf_env = vf_env
        self._servings: dict[int, Serving] = {}
        taskset = vf_env.taskset
        try:
            self.tasks = list(taskset.head(MAX_TASKS) if taskset.INFINITE else taskset)
        except Exception as exc:  # the taskset's own load()
            raise ConfigError(
                f"the verifiers v1 taskset '{taskset_id}' raised in load(): {type(exc).__name__}: {exc}"
            ) from None
        if not self.tasks:
            raise ConfigError(f"the verifiers v1 taskset '{taskset_id}' yields no tasks.")
        rows = [_row(index, task) for index, task in enumerate(self.tasks)]
        first = self.tasks[0]
        pairs = [(fn.__name__, float(getattr(fn, "_vf_weight", 1.0))) for fn in first.hooks("reward")]
        super().__init__(
            dataset=lambda: Dataset.from_list(rows),
            eval_dataset=lambda: Dataset.from_list(rows),
            rubric=V1Rubric(pairs),  # type: ignore[arg-type]
            rollout_timeout=_outer_bound(vf_env.config.timeout.episode),
            env_args=env_args,  # the id the user gave is recorded by the registry
        )

    async def rollout(
        self, row: dict[str, Any], client: Any, model: str, sampling_args: dict[str, Any] | None = None
    ) -> State:
        started = time.perf_counter()
        state = self.init_state(row)
        args = self.merged_sampling_args(sampling_args)
        try:
            task = self.tasks[int(state.info["v1_task"])]
            async with asyncio.timeout(self.rollout_timeout):
                trace, responses = await self._episode(task, client, model, args)
            _fill(state, trace, responses)
        except TimeoutError:
            self.mark_timed_out(state)
        except EpisodeFailed as failed:
            state.stop_reason = (StopReason.TIMEOUT if failed.timed_out else StopReason.ENV_ERROR).value
            state.error = str(failed)
        except Exception as exc:  # verifiers records its own failures on the episode; this is outside it
            state.stop_reason, state.error = StopReason.ENV_ERROR.value, f"{type(exc).__name__}: {exc}"
        state.metrics["num_turns"] = float(len(state.turns))
        state.timing.total_s = time.perf_counter() - started
        return state

    async def _episode(
        self, task: Any, client: Any, model: str, args: dict[str, Any]
    ) -> tuple[Any, list[Any]]:
        """One verifiers episode of ``task`` against ``client``: its one trace and the responses it got."""
        from verifiers.v1.env import RunSlot
        from verifiers.v1.types import SamplingConfig

        sampling = SamplingConfig(**{k: v for k, v in args.items() if v is not None})
        async with self._serving_for(client) as serving:
            episode = await self.vf_env.run_slot(RunSlot(task), serving.context(model, sampling))
            if episode.errors and not episode.traces:
                raise EpisodeFailed(episode.errors[0])
            (trace,) = episode.traces
            trace.errors.extend(episode.errors)
            return trace, serving.endpoint.take(trace.id)

    def _serving_for(self, client: Any) -> Serving:
        """The client's serving resources in this event loop; one made in another loop (a backend
        that runs each step or trajectory in a loop of its own) is replaced, having closed itself."""
        loop = asyncio.get_running_loop()
        serving = self._servings.get(id(client))
        if serving is None or serving.loop is not loop or serving.client is not client:
            serving = self._servings[id(client)] = Serving(self.vf_env, client, loop)
        return serving

    async def score_group(self, states: list[State]) -> None:
        await self.rubric.score_group(states)


class Serving:
    """verifiers' serving resources (interception server, shared tools) and our endpoint, open while
    any rollout of one event loop runs: verifiers multiplexes concurrent rollouts over one interception
    server and one model client, and opening them per rollout cost ~80 ms (two TLS contexts)."""

    def __init__(self, vf_env: Any, client: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.vf_env, self.client, self.loop = vf_env, client, loop
        self.endpoint = SessionEndpoint(client)
        self.key_var = f"BRIDGES_V1_ENDPOINT_{id(self):x}"  # verifiers' client reads its key from one
        self._users = 0
        self._lock = asyncio.Lock()
        self._stack: contextlib.AsyncExitStack | None = None

    def context(self, model: str, sampling: Any) -> Any:
        from verifiers.v1.clients import ModelContext
        from verifiers.v1.configs.client import EvalClientConfig

        return ModelContext(
            model, EvalClientConfig(base_url=self.endpoint.base_url, api_key_var=self.key_var), sampling
        )

    async def __aenter__(self) -> Serving:
        async with self._lock:
            if self._users == 0:
                await self._open()
            self._users += 1
        return self

    async def __aexit__(self, *exc: object) -> None:
        async with self._lock:
            self._users -= 1
            if self._users == 0 and self._stack is not None:
                stack, self._stack = self._stack, None
                await stack.aclose()

    async def _open(self) -> None:
        from bridges.adapters.verifiers.v1_seat import close_http_clients

        stack = contextlib.AsyncExitStack()
        try:
            await stack.enter_async_context(self.endpoint)
            os.environ[self.key_var] = self.endpoint.secret
            stack.callback(os.environ.pop, self.key_var, None)
            stack.push_async_callback(close_http_clients)
            await stack.enter_async_context(self.vf_env.serving())
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack


def _outer_bound(episode_timeout: float | None) -> float:
    """Our bound on one rollout: verifiers' own episode deadline (``env_args.timeout.episode``) plus a
    minute for scoring, or ``EPISODE_TIMEOUT`` where verifiers sets none."""
    return EPISODE_TIMEOUT if episode_timeout is None else float(episode_timeout) + 60.0


def _row(index: int, task: Any) -> dict[str, Any]:
    """A dataset row naming its task; the prompt is shown in traces and results, not re-rendered."""
    data = task.data
    prompt = data.prompt
    messages = (
        [{"role": "user", "content": prompt}] if isinstance(prompt, str) else to_message_dicts(prompt or [])
    )
    system = getattr(data, "system_prompt", None)
    if system:
        messages = [{"role": "system", "content": system}, *messages]
    return {"example_id": index, "prompt": messages, "info": {"v1_task": index}, "task": type(task).__name__}


def _fill(state: State, trace: Any, responses: list[Any]) -> None:
    """Our state from the episode's trace: the completion, the sampled turns, the reward or the failure."""
    from bridges.envs.multiturn import turn_from_response

    messages = to_message_dicts(trace.messages)
    state.completion = messages[len(state.prompt) :] if len(messages) > len(state.prompt) else messages
    state.turns = [turn_from_response(r) for r in responses]
    state.extras["v1_trace_id"] = trace.id
    if trace.errors:
        message = "; ".join(f"{e.type}: {e.message}" for e in trace.errors)
        scoring = any("scoring" in e.message for e in trace.errors)
        state.stop_reason = (StopReason.REWARD_ERROR if scoring else StopReason.ENV_ERROR).value
        state.error = message
        return
    reward = float(trace.reward)
    if not math.isfinite(reward):  # verifiers sums what the rewards returned; a NaN must not train
        state.stop_reason, state.error = StopReason.REWARD_ERROR.value, f"the trace's reward is {reward}."
        return
    state.stop_reason = StopReason.COMPLETED.value
    state.reward = reward
    # each reward function's score under its name, as every rubric reports it (TRL logs them)
    state.metrics.update({name: float(r.score) for name, r in trace.rewards.items() if r is not None})
    state.metrics.update(
        {k: float(v) for k, v in (trace.metrics or {}).items() if isinstance(v, int | float)}
    )
