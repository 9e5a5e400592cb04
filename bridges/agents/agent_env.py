"""``AgentEnv``: an environment whose rollout is one run of an agent you already have.

The agent — an async function, or any program — is pointed at a session of its own (a base URL on
loopback, ``bridges.agents.sessions``) and left to work. When it ends, the calls it made on that
session are the rollout: the turns are the responses the engine sampled, in the order they were
answered, so training sees exactly the sampled ids, whatever framework sat between. The rubric then
scores the rollout as any other; it also sees how the agent's run ended as ``state["agent"]``
(an ``AgentOutcome``: what the function returned, or the command's exit code and output).

Turns become training samples by the rule every backend uses (``workflows/samples.py``): a call
whose prompt extends the previous call's prompt and reply, token for token, continues one sample; a
call that does not (the agent rewrote or dropped history, or ran a side conversation) starts a new
sample of the same rollout with the same advantage, and is counted as a break. An agent that
re-sends its history unchanged, as the OpenAI Agents SDK, pydantic-ai and LangChain do, is one
sample with no break.

A rollout is masked, with its reason, when the agent raises or exits non-zero, outlives
``agent_timeout``, never calls the model, or goes past its session's cap on calls or sampled tokens.
A call after the rollout ended is refused (410) and changes nothing.
"""

from __future__ import annotations

import asyncio
import inspect
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from bridges.agents.agent_run import AgentCallable, AgentOutcome, Endpoint, run_callable, run_command
from bridges.agents.loopback import LoopbackServers
from bridges.agents.sessions import MAX_CALLS, MAX_SAMPLED_TOKENS, Session
from bridges.envs.base import Environment
from bridges.envs.multiturn import measure_drift, turn_from_response
from bridges.envs.types import State, StopReason
from bridges.runtime.errors import ConfigError

TASK_FRAMING_ROLES = ("system", "developer", "user")


class AgentEnv(Environment):
    """Runs ``agent(base_url, api_key, row)`` (async) or ``command`` once per rollout against its own
    session; the session's calls are the rollout, scored by the rubric. The row the agent gets is the
    dataset row with ``prompt`` as chat messages (system prompt and ``question`` folded in, as every
    environment builds it); it holds ``answer`` too, for the agent to keep from the model."""

    rescore_refusal = "an agent's rollout is scored with how its run ended, which a saved trace does not keep."

    def __init__(
        self,
        agent: AgentCallable | None = None,
        *,
        command: str | Sequence[str] | None = None,
        command_env: Mapping[str, str] | None = None,
        command_inherit: Sequence[str] = (),
        agent_timeout: float = 600.0,
        max_calls: int = MAX_CALLS,
        max_sampled_tokens: int = MAX_SAMPLED_TOKENS,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.agent, self.command = _checked_agent(agent, command)
        # the command's environment: a small allowlist (agent_run.agent_environment), ``command_inherit``
        # names copied from ours, ``command_env`` as given; never the trainer's keys unless named here
        self.command_env, self.command_inherit = dict(command_env or {}), [str(n) for n in command_inherit]
        if not agent_timeout > 0:
            raise ConfigError(f"agent_timeout must be a positive number of seconds, got {agent_timeout!r}.")
        if max_calls < 1 or max_sampled_tokens < 1:
            raise ConfigError("max_calls and max_sampled_tokens must each be at least 1.")
        self.agent_timeout, self.max_calls, self.max_sampled_tokens = agent_timeout, max_calls, max_sampled_tokens
        self._servers = LoopbackServers()

    async def run_episode(
        self, row: dict[str, Any], state: State, client: Any, model: str, args: dict[str, Any]
    ) -> None:
        """One run of the agent; its failures end the rollout masked with one sentence, never raise."""
        try:
            async with asyncio.timeout(self.rollout_timeout):
                conversation = await self._run(state, {**row, "prompt": state.prompt}, client, model, args)
        except TimeoutError:
            self.mark_timed_out(state)
        else:
            await measure_drift(state, client, conversation, self.model_timeout)

    async def _run(
        self, state: State, row: dict[str, Any], client: Any, model: str, args: dict[str, Any]
    ) -> list[dict[str, Any]]:
        """Run the agent on a session of its own; the state filled, and the session's last exchange."""
        async with self._servers.enter() as server:
            session = server.sessions.open(client, model, args, self.max_calls, self.max_sampled_tokens)
            at = Endpoint(server.base_url(session), server.session_root(session), api_key=session.id)
            try:
                if self.agent is not None:
                    outcome = await run_callable(self.agent, at, row, self.agent_timeout)
                else:
                    argv = with_prompt(self.command, state)
                    outcome = await run_command(
                        argv, at, row, self.agent_timeout, self.command_env, self.command_inherit
                    )
            finally:
                server.sessions.close(session)  # a call still running is answered, but not recorded
        return fill_state(state, session, outcome)


def _checked_agent(
    agent: AgentCallable | None, command: str | Sequence[str] | None
) -> tuple[AgentCallable | None, list[str]]:
    """Exactly one of an async callable and a non-empty command, or one sentence saying what is wrong."""
    if (agent is None) == (command is None):
        raise ConfigError("AgentEnv needs exactly one of agent= (an async function) and command= (a program).")
    if agent is not None:
        asynchronous = inspect.iscoroutinefunction(agent) or inspect.iscoroutinefunction(type(agent).__call__)
        if not asynchronous:  # an instance with an async __call__ counts
            raise ConfigError(
                "agent= must be an async function, async def agent(base_url, api_key, row); run a "
                "synchronous agent as command= (its own process), where its deadline can stop it."
            )
        return agent, []
    argv = shlex.split(command) if isinstance(command, str) else [str(a) for a in command or ()]
    if not argv:
        raise ConfigError("command= names no program.")
    return None, argv


def with_prompt(argv: list[str], state: State) -> list[str]:
    """``argv`` with ``{prompt}`` replaced by the row's last user message (for agents that take the task as
    an argument; the whole row also arrives on stdin as JSON)."""
    users = [m.get("content") for m in state.prompt if m.get("role") == "user"]
    text = users[-1] if users and isinstance(users[-1], str) else ""
    return [arg.replace("{prompt}", text) for arg in argv]


def fill_state(state: State, session: Session, outcome: AgentOutcome) -> list[dict[str, Any]]:
    """The rollout from the session's record and the run's outcome, masked when either went wrong; returns
    the last exchange (its messages and reply), which the drift measurement re-renders."""
    state.extras["agent"] = outcome
    state.turns = [turn_from_response(r) for r in session.responses]
    conversation = session.last_exchange()
    framing = next((i for i, m in enumerate(conversation) if m["role"] not in TASK_FRAMING_ROLES), 0)
    state.completion = conversation[framing:]  # what the agent and the model did after the task was set
    state.metrics["agent/calls"] = float(len(session.responses))
    if session.over_cap is not None:  # first: an agent cut off by its cap usually fails on the refusal
        state.stop_reason, state.error = StopReason.ENV_ERROR.value, session.over_cap
    elif outcome.error is not None:
        state.stop_reason = (StopReason.TIMEOUT if outcome.timed_out else StopReason.ENV_ERROR).value
        state.error = outcome.error
    elif not session.responses:
        state.stop_reason = StopReason.ENV_ERROR.value
        state.error = "the agent finished without calling the model, so there is nothing to train on."
    else:
        state.stop_reason = StopReason.COMPLETED.value
    return conversation
