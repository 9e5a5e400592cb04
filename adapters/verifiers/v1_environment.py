"""``V1Environment``: a verifiers v1 taskset (and its ``Env``, if it has one) behind our ``Environment``.

Each rollout is one verifiers episode run by verifiers' own machinery — ``Env.serving``,
``Env.run_slot`` (so ``setup``/``run``/``finalize``), the task's hooks and ``@vf.reward``/``@vf.metric``
scoring, its interception server — with every model call answered by the backend's ``EngineClient``
through an endpoint that records the sampled ids per agent trace (``v1_endpoint``), which the
interception server asks in-process (``v1_relay``). Agents on
verifiers' ``null`` harness run in this process (``v1_seat``).

Several agents (self-play seats, proposer and solver, a modeled user): a dataset row is one task × one
trainable seat, and a rollout of it yields that seat's trace as its sample, with that trace's reward.
A group is therefore task × seat, the baseline the public multi-agent examples ask for
(``kuhn_poker``: "per game x seat"), and it is the same on every backend because it lives in the
rows. The rollouts of one task's seats share episodes where they run together (``v1_sharing``), so
one hand trains every trainable seat, and a seat that runs several times in one episode
(``best-of-n``) trains on each of its traces, one per rollout of that seat; ``v1/seat_traces`` counts
the seat's traces in the episode. Seats the env's ``setup()`` stands down (``trainable=False``) get
no rows.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import functools
import math
from typing import Any

from bridges.adapters.verifiers.factory_signatures import install as remember_factory_signatures
from bridges.adapters.verifiers.support import require_verifiers
from bridges.adapters.verifiers.v1_serving import Serving
from bridges.adapters.verifiers.v1_sharing import Match
from bridges.adapters.verifiers.v1_taskset import tasks_of
from bridges.envs.base import Environment
from bridges.envs.messages import to_message_dicts
from bridges.envs.types import State, StopReason
from bridges.runtime.errors import ConfigError

# The seed of the group a rollout belongs to. Member i of a group samples with ``seed + i``
# (``Environment.run_group``), so a seat's own rollouts could never meet on one episode if they matched
# on their own seeds; they match on the group's, and the episode's sessions get seeds of their own
# (``v1_endpoint``). Unset where a backend runs single rollouts (verl): each matches on its own.
_GROUP_SEED: contextvars.ContextVar[Any] = contextvars.ContextVar("v1_group_seed", default=None)
EPISODE_TIMEOUT = 600.0  # seconds: verifiers sets no limit by default; env_args.timeout.* sets its own


class EpisodeFailed(Exception):
    """verifiers ended the episode with errors and no trace (its ``run()`` raised or timed out)."""

    def __init__(self, error: Any) -> None:
        super().__init__(f"{error.type}: {error.message}")
        self.timed_out = error.type == "TimeoutError"

    @classmethod
    def of(cls, message: str) -> EpisodeFailed:
        from verifiers.v1.trace import Error

        return cls(Error(type="EnvError", message=message))


class V1Rubric:
    """The face of a taskset's rewards that backends read: one function, ``trace_reward``, verifiers'
    own ``trace.reward`` (the weighted sum of every reward on the trace — the task's ``@vf.reward``s
    and what the env's ``run``/``finalize`` recorded, which no declaration lists before an episode
    runs). Each reward's score is also a metric under its own name. verifiers scores each episode."""

    REWARD = "trace_reward"

    def __init__(self) -> None:
        self.parser = None

    def get_reward_func_names(self) -> list[str]:
        return [self.REWARD]

    def get_reward_weights(self) -> list[float]:
        return [1.0]

    async def score_group(self, states: list[State]) -> None:
        """Nothing to do: each state's reward is its trace's, computed by verifiers when it ended."""


class V1Environment(Environment):
    rescore_refusal = (
        "bridges.rescore cannot score traces of a verifiers v1 taskset again: verifiers scores each "
        "episode's live trace when it ends; run bridges.eval instead."
    )

    def __init__(self, vf_env: Any, *, seats: list[str], taskset_id: str, env_args: dict[str, Any]) -> None:
        from datasets import Dataset

        remember_factory_signatures()  # a v1 trace turn pays pydantic's signature check otherwise
        self.vf_env = vf_env
        self._servings: dict[int, Serving] = {}  # by event loop
        taskset = vf_env.taskset
        try:
            self.tasks = tasks_of(taskset, require_verifiers())  # either release's views (v1_taskset)
        except Exception as exc:  # the taskset's own load()
            raise ConfigError(
                f"the verifiers v1 taskset '{taskset_id}' raised in load(): {type(exc).__name__}: {exc}"
            ) from None
        if not self.tasks:
            raise ConfigError(f"the verifiers v1 taskset '{taskset_id}' yields no tasks.")
        self.trainable_seats = seats
        self.traces_per_seat = dict.fromkeys(seats, 1)  # learnt from each finished episode (v1_sharing)
        self.rows_together = len(seats)  # a task's seat rows, kept adjacent so their rollouts share episodes
        rows = [_row(index, task, seat) for index, task in enumerate(self.tasks) for seat in seats]
        super().__init__(
            dataset=lambda: Dataset.from_list(rows),
            eval_dataset=lambda: Dataset.from_list(rows),
            rubric=V1Rubric(),  # type: ignore[arg-type]
            rollout_timeout=_outer_bound(vf_env.config.timeout.episode),
            env_args=env_args,  # the id the user gave is recorded by the registry
        )

    async def run_group(
        self,
        row: dict[str, Any],
        client: Any,
        model: str,
        group_size: int,
        sampling_args: dict[str, Any] | None = None,
        *,
        semaphore: Any = None,
    ) -> list[State]:
        token = _GROUP_SEED.set((sampling_args or {}).get("seed"))
        try:
            return await super().run_group(row, client, model, group_size, sampling_args, semaphore=semaphore)
        finally:
            _GROUP_SEED.reset(token)

    async def run_episode(
        self, row: dict[str, Any], state: State, client: Any, model: str, args: dict[str, Any]
    ) -> None:
        """This rollout's seat in a verifiers episode (module doc), masked with the reason where it fails."""
        try:
            task_index, seat = int(state.info["v1_task"]), str(state.info["v1_seat"])
            group_seed = _GROUP_SEED.get()
            match_args = args if group_seed is None else {**args, "seed": group_seed}
            match = Match(task_index, client, model, match_args)
            async with asyncio.timeout(self.rollout_timeout):
                trace, responses, shared, traces = await self._seat_trace(match, seat, args)
            _fill(state, trace, responses)
            state.metrics["v1/shared_episode"] = float(shared)
            state.metrics["v1/seat_traces"] = float(traces)
        except TimeoutError:
            self.mark_timed_out(state)
        except EpisodeFailed as failed:
            state.stop_reason = (StopReason.TIMEOUT if failed.timed_out else StopReason.ENV_ERROR).value
            state.error = str(failed)
        except Exception as exc:  # verifiers records its own failures on the episode; this is outside it
            state.stop_reason, state.error = StopReason.ENV_ERROR.value, f"{type(exc).__name__}: {exc}"

    async def _seat_trace(self, match: Match, seat: str, args: dict[str, Any]) -> tuple[Any, list[Any], bool, int]:
        """This rollout's trace of ``seat`` in an episode of the match's task, the responses it got,
        whether another rollout played that episode (``v1_sharing``), and how many traces the seat
        left in it. An episode this rollout starts samples with its own ``args``."""
        serving = self._serving_for()
        task = self.tasks[match.task]
        played = functools.partial(self._play, serving, task, match.client, match.model, args)
        (episode, calls), index, shared = await serving.episodes.play(
            match, seat, self.traces_per_seat, played
        )
        mine = _seat_traces(episode, seat)
        if index >= len(mine):  # the episode left fewer traces of the seat than the last one: our own
            (episode, calls), index, shared = await played(), 0, False
            mine = _seat_traces(episode, seat)
        return mine[index], calls[mine[index].id], shared, len(mine)

    async def _play(
        self, serving: Serving, task: Any, client: Any, model: str, args: dict[str, Any]
    ) -> tuple[Any, dict[str, Any]]:
        """One verifiers episode of ``task`` answered by ``client``, and every trace's responses."""
        from verifiers.v1.env import RunSlot
        from verifiers.v1.types import SamplingConfig

        number = f"{next(serving.numbers)}"
        async with serving:
            try:
                named = serving.endpoint.open_episode(number)
                sampling = SamplingConfig(**{k: v for k, v in args.items() if v is not None}, **named)
                context = serving.context(client, model, sampling)
                episode = await self.vf_env.run_slot(RunSlot(task), context)
                calls = {trace.id: serving.endpoint.take(number, trace.id) for trace in episode.traces}
            finally:
                serving.endpoint.end_episode(number)
        for trace in episode.traces:  # a failed finalize() is the failure of every trace's sample
            trace.errors.extend(episode.errors)
        counts = collections.Counter(trace.agent.name for trace in episode.traces)
        self.traces_per_seat.update({seat: counts[seat] for seat in self.trainable_seats if counts[seat]})
        return episode, calls

    def _serving_for(self) -> Serving:
        """The serving resources of the running event loop; one made in another loop (a backend that
        runs each step or trajectory in a loop of its own) is replaced, having closed itself."""
        loop = asyncio.get_running_loop()
        serving = self._servings.get(id(loop))
        if serving is None or serving.loop is not loop:
            serving = self._servings[id(loop)] = Serving(self.vf_env, loop)
        return serving

    async def score_group(self, states: list[State]) -> None:
        await self.rubric.score_group(states)


def _outer_bound(episode_timeout: float | None) -> float:
    """Our bound on one rollout: verifiers' own episode deadline (``env_args.timeout.episode``) plus a
    minute for scoring, or ``EPISODE_TIMEOUT`` where verifiers sets none."""
    return EPISODE_TIMEOUT if episode_timeout is None else float(episode_timeout) + 60.0


def _row(index: int, task: Any, seat: str) -> dict[str, Any]:
    """A dataset row naming its task and seat. The prompt is shown in traces and results, never
    rendered: a multi-agent env gives each seat what it likes at run time, often nothing up front, and
    such a row says so in one placeholder message (every backend's dataset needs a non-empty prompt)."""
    data = task.data
    prompt = data.prompt
    messages = (
        [{"role": "user", "content": prompt}] if isinstance(prompt, str) else to_message_dicts(prompt or [])
    )
    system = getattr(data, "system_prompt", None)
    if system:
        messages = [{"role": "system", "content": system}, *messages]
    if not messages:
        opened = f"[verifiers v1 task {index}, agent '{seat}': the environment opens the conversation]"
        messages = [{"role": "user", "content": opened}]
    return {
        "example_id": index,
        "prompt": messages,
        "info": {"v1_task": index, "v1_seat": seat},
        "task": type(task).__name__,
    }


def _seat_traces(episode: Any, seat: str) -> list[Any]:
    """The traces ``seat`` left in ``episode``, in verifiers' order; none is a failed episode."""
    if episode.errors and not episode.traces:
        raise EpisodeFailed(episode.errors[0])
    mine = [trace for trace in episode.traces if trace.agent.name == seat]
    if not mine:
        raise EpisodeFailed.of(f"the episode ran no '{seat}' agent ({len(episode.traces)} traces).")
    return mine


def _fill(state: State, trace: Any, responses: list[Any]) -> None:
    """Our state from one trace of the seat: the completion, the sampled turns, the reward or the
    failure; a reply an interception hook rewrote is counted (the turns hold what was sampled)."""
    from bridges.envs.multiturn import turn_from_response

    messages = to_message_dicts(trace.messages)
    shown = len(state.prompt)  # the trace repeats the row's prompt, unless the env gave the seat another
    state.completion = messages[shown:] if messages[:shown] == to_message_dicts(state.prompt) else messages
    state.turns = [turn_from_response(r) for r in responses]
    state.extras["v1_trace_id"] = trace.id
    state.metrics["v1/rewritten_replies"] = float(len(trace.response_rewrites))
    if not trace.agent.trainable:
        state.stop_reason = StopReason.ENV_ERROR.value
        state.error = f"the env's setup() stood agent '{trace.agent.name}' down (trainable = False)."
        return
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
    state.metrics[V1Rubric.REWARD] = reward
    # each reward function's score under its name, as every rubric reports it (TRL logs them)
    state.metrics.update({name: float(r.score) for name, r in trace.rewards.items() if r is not None})
    state.metrics.update(
        {k: float(v) for k, v in (trace.metrics or {}).items() if isinstance(v, int | float)}
    )
