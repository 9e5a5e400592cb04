"""``BridgesAgentLoop``: any rl-bridges environment as a verl 0.9.1 agent loop.

verl creates one loop instance per trajectory inside its ``AgentLoopWorker`` and awaits
``run(sampling_params, **row)``. We run the environment's own rollout against an ``EngineClient``
over verl's server client (``VerlServerEngine``), so the environment talks to an ordinary
``AsyncOpenAI`` while every id verl trains on is exactly what its server sampled, and score it with
the environment's rubric. Registered through the YAML file ``adapters.verl.launch`` writes
(``agent_loop_config_path``), which carries ``env_id``/``env_args``/``sampling_args`` as constructor
arguments.

What comes back (``AgentLoopOutput``):
- ``prompt_ids``: the first turn's prompt; ``response_ids``: the rest of the ledger (sampled ids,
  then environment/tool ids, then the next sampled ids), cut to ``rollout.response_length``;
- ``response_mask``: 1 on sampled ids, 0 on ids we added; ``response_logprobs``: the server's;
- ``reward_score``: the rubric's reward, so verl writes ``rm_scores`` and skips its reward manager.
A trajectory that runs out of response budget ends like verl's own tool loop does: the turn that
hit the limit is kept (closed, never spliced onto) and the rollout is scored. A rollout that fails
(environment error, reward error, engine error) becomes a fully masked sample with reward 0 and
its reason in ``extra_fields``; nothing it raises reaches the worker. The 0 never enters its group's
baseline: ``advantages.py`` computes verl's GRPO advantages over the valid members only.

verl runs each trajectory in its own loop; the loops of one prompt meet in their worker to be scored
as a group (``group_scoring.py``). ``sampling.max_tokens`` arrives as ``sampling_args`` and caps each
model turn, as on every backend; ``rollout.response_length`` is the whole trajectory's budget.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from bridges.adapters.verl.dataset import row_from_kwargs
from bridges.adapters.verl.engine import VerlServerEngine
from bridges.adapters.verl.group_scoring import score_in_group
from bridges.envs.base import Environment
from bridges.envs.types import State, StopReason
from bridges.runtime.asyncutils import describe_exception
from bridges.runtime.errors import require_extra
from bridges.workflows.samples import prompt_completion

if TYPE_CHECKING:
    from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput
else:  # verl's base class is needed at class-definition time; without verl, one sentence naming the extra
    _verl_loop = require_extra("verl.experimental.agent_loop.agent_loop", "verl", "backend=verl's agent loop")
    AgentLoopBase = _verl_loop.AgentLoopBase
    AgentLoopMetrics = _verl_loop.AgentLoopMetrics
    AgentLoopOutput = _verl_loop.AgentLoopOutput

BUDGET_EXHAUSTED = "response_length"  # stop reason of a trajectory cut by rollout.response_length
_ENVIRONMENTS: dict[str, Environment] = {}


def cached_environment(env_id: str, env_args: dict[str, Any] | None) -> Environment:
    """One environment per (id, args) per worker process: verl builds a loop per trajectory."""
    from bridges.envs.registry import load_environment

    key = json.dumps([env_id, env_args or {}], sort_keys=True, default=str)
    if key not in _ENVIRONMENTS:
        _ENVIRONMENTS[key] = load_environment(env_id, **(env_args or {}))
    return _ENVIRONMENTS[key]


def _plain(value: Any) -> Any:
    """hydra hands YAML mappings over as ``DictConfig``; the environment wants plain dicts."""
    from omegaconf import DictConfig, OmegaConf

    return OmegaConf.to_container(value, resolve=True) if isinstance(value, DictConfig) else value


class BridgesAgentLoop(AgentLoopBase):
    def __init__(
        self,
        *args: Any,
        env_id: str,
        env_args: dict[str, Any] | None = None,
        model_name: str = "policy",
        run_dir: str | None = None,
        provenance: dict[str, Any] | None = None,
        sampling_args: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)  # verl also passes tools=..., which the base class accepts
        self.env = cached_environment(env_id, _plain(env_args))
        self.sampling_args = _plain(sampling_args) or None  # sampling.max_tokens: a cap on each model turn
        self.model_name = model_name
        self.traces = None
        if run_dir is not None:  # the launcher's runs: every rollout's trace in the run folder
            from bridges.adapters.verl.run_files import trace_writer

            self.traces = trace_writer(run_dir, _plain(provenance) or {})
        self.prompt_length = int(self.rollout_config.prompt_length)
        self.response_length = int(self.rollout_config.response_length)

    def group_size(self, split: str | None) -> int:
        """Rollouts per prompt: ``rollout.n`` in training, ``val_kwargs.n`` in verl's validation."""
        n = self.rollout_config.val_kwargs.n if split == "eval" else self.rollout_config.n
        return int(n)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        from bridges.client import EngineClient

        started = time.perf_counter()
        engine = VerlServerEngine(
            self.server_manager,
            self.tokenizer,
            base_sampling_params=sampling_params,
            response_length=self.response_length,
        )
        client = EngineClient(engine, model_name=self.model_name)
        split = (kwargs.get("extra_info") or {}).get("split")  # verl's validation runs us too
        failure = None
        try:
            state = await self.env.rollout(row_from_kwargs(kwargs), client, self.model_name, self.sampling_args)
            if state.stop_reason == StopReason.PROMPT_TOO_LONG.value and state.turns:
                # the client refused the next turn because the response budget is spent: a truncated
                # trajectory, trained on like any other (the prompt itself fit, or there would be no turn)
                state.stop_reason, state.error = BUDGET_EXHAUSTED, None
        except Exception as exc:  # a bug below the environment's own error handling: still a sample
            failure = describe_exception(exc)
            state = State(error=failure, stop_reason=StopReason.ENV_ERROR.value)  # joins its group, masked
        scoring = time.perf_counter()
        try:
            await score_in_group(self.env, state, kwargs.get("uid"), self.group_size(split))
            if failure is not None:
                return self._failed(kwargs, client, failure, started)
            if self.traces is not None:  # step: verl's global step, one past the weights it sampled from
                versions = [t.weight_version for t in state.turns if t.weight_version is not None]
                self.traces.write_state(state, step=min(versions) + 1 if versions else None, split=split)
            return self._output(state, client, started, time.perf_counter() - scoring)
        except Exception as exc:
            return self._failed(kwargs, client, describe_exception(exc), started)

    def _output(self, state: Any, client: Any, started: float, score_s: float) -> AgentLoopOutput:
        split = prompt_completion(state, self.response_length)
        valid = state.trainable
        if split is None or len(split.prompt_ids) > self.prompt_length:
            error = state.error or f"the prompt does not fit rollout.prompt_length={self.prompt_length}"
            return self._failed({"raw_prompt": state.prompt}, client, error, started, state.stop_reason)
        return AgentLoopOutput(
            prompt_ids=split.prompt_ids,
            response_ids=split.completion_ids,
            response_mask=split.mask,  # all 0 for an invalid rollout
            response_logprobs=split.logprobs,
            reward_score=float(state.reward) if valid else 0.0,
            num_turns=len(state.completion) + 1,
            metrics=AgentLoopMetrics(
                generate_sequences=state.timing.generation_s,
                tool_calls=float(state.metrics.get("tool_calls", 0.0)),
                compute_score=score_s,
            ),
            extra_fields=self._extra(
                state.stop_reason, state.error, valid, state.metrics, state.drift_tokens
            ),
        )

    def _failed(
        self, kwargs: dict[str, Any], client: Any, error: str, started: float, reason: str | None = None
    ) -> AgentLoopOutput:
        """A fully masked one-token sample with reward 0: verl trains nothing on it and keeps running."""
        prompt = kwargs.get("raw_prompt") or [{"role": "user", "content": ""}]
        end_of_turn = int(
            getattr(self.tokenizer, "eos_token_id", None) or 0
        )  # verl types it as AutoTokenizer
        try:
            prompt_ids = client.renderer.render_ids(list(prompt))[-self.prompt_length :]
        except Exception:  # even the prompt cannot be rendered: an end-of-turn id stands in for it
            prompt_ids = [end_of_turn]
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=[end_of_turn],
            response_mask=[0],
            response_logprobs=[0.0],
            reward_score=0.0,
            num_turns=1,
            metrics=AgentLoopMetrics(generate_sequences=time.perf_counter() - started),
            extra_fields=self._extra(reason or StopReason.ENV_ERROR.value, error, False, {}, None),
        )

    @staticmethod
    def _extra(
        reason: str | None, error: str | None, valid: bool, metrics: dict[str, float], drift: int | None
    ) -> dict[str, Any]:
        """The same keys on every sample (verl stacks them into one column each)."""
        return {
            "turn_scores": [],
            "tool_rewards": [],
            "bridges_stop_reason": reason or "",
            "bridges_error": error or "",
            "bridges_valid": valid,
            "bridges_drift_tokens": int(drift or 0),
            "bridges_metrics": json.dumps({k: float(v) for k, v in metrics.items()}),
        }
