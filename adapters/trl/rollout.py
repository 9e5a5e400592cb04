"""``trl_rollout_func(env)``: multi-turn and tool environments inside TRL's ``GRPOTrainer``.

TRL calls ``rollout_func(prompts, trainer)`` once per generation batch with every prompt already
repeated ``num_generations`` times. We cut the batch back into GRPO groups, run each group through
the environment with an ``EngineClient`` over whatever generation TRL is using, and hand back one
token-exact sequence per rollout:

- ``prompt_ids``: the first turn's prompt; ``completion_ids``: everything after it (sampled ids,
  then environment/tool ids, then the next sampled ids, exactly as the ledger recorded them);
- ``env_mask``: 1 on sampled ids, 0 on ids we added (TRL multiplies it into its loss mask);
- ``logprobs``: the engine's logprob per sampled id (0.0 where nothing was sampled);
- ``SCORES_KEY``: the rubric's scores, read by the functions from ``trl_reward_funcs(env)``.

TRL does not truncate what a ``rollout_func`` returns, so completions are cut to
``max_completion_length`` here. A rollout that failed keeps its tokens but all of them masked,
and its reward functions return ``None``, which TRL keeps out of the group baseline.

Generation behind the client, by TRL setting:
- ``use_vllm=False``: the trainer's own model (unwrapped for generation) in an ``HFEngine``;
- ``vllm_mode="server"``: ``VLLMServerEngine`` on TRL's server, token ids in and out (TRL syncs
  the server's weights before calling us);
- ``vllm_mode="colocate"``: ``VLLMColocateEngine`` on ``trainer.vllm_generation.llm``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from bridges.adapters.trl.dataset import RowIndex
from bridges.adapters.trl.rewards import SCORES_KEY, state_scores
from bridges.envs.base import Environment
from bridges.runtime.asyncutils import run_sync
from bridges.runtime.errors import ConfigError
from bridges.workflows.rollouts import run_group
from bridges.workflows.samples import PromptCompletion, prompt_completion

RolloutFunc = Callable[[list[Any], Any], dict[str, Any]]


def unsampled_settings(args: Any) -> list[str]:
    """GRPOConfig's sampling settings set away from their defaults that a multi-turn rollout cannot honour."""
    said = [f"repetition_penalty={args.repetition_penalty}"] if args.repetition_penalty != 1.0 else []
    said += [f"min_p={args.min_p}"] if args.min_p else []
    return said + (["generation_kwargs"] if args.generation_kwargs else [])


def check_trainer(trainer: Any) -> None:
    """Refuse settings under which TRL would silently ignore what the rollout function returns."""
    if getattr(trainer, "tools", None) or getattr(trainer, "environment_factories", None):
        raise ConfigError(
            "trl_rollout_func cannot be combined with GRPOTrainer(tools=...) or environment_factory=...: "
            "TRL then runs its own tool loop and ignores env_mask; give the tools to the environment instead."
        )
    args = trainer.args
    unsampled = unsampled_settings(args)
    if unsampled:
        raise ConfigError(
            f"trl_rollout_func samples every turn through EngineClient, which has no {', '.join(unsampled)}: TRL "
            "would train as if they applied; remove them (temperature, top_p and top_k reach every turn)."
        )
    if getattr(trainer, "use_vllm", False) and args.vllm_mode == "colocate":
        if getattr(args, "vllm_enable_sleep_mode", False):
            raise ConfigError(
                "trl_rollout_func does not manage vLLM sleep mode; set vllm_enable_sleep_mode=False."
            )
        if getattr(args, "vllm_tensor_parallel_size", 1) > 1:
            raise ConfigError(
                "trl_rollout_func with colocated vLLM needs vllm_tensor_parallel_size=1 "
                "(tensor-parallel ranks would have to generate in lockstep); use vllm_mode='server'."
            )


def trainer_sampling_args(trainer: Any) -> dict[str, Any]:
    """The sampling settings TRL itself would use, as OpenAI arguments for every model turn."""
    args = trainer.args
    out: dict[str, Any] = {"max_tokens": int(args.max_completion_length)}
    if getattr(args, "temperature", None) is not None:
        out["temperature"] = float(args.temperature)
    if getattr(args, "top_p", None) is not None:
        out["top_p"] = float(args.top_p)
    top_k = getattr(args, "top_k", None)
    if top_k:
        out["extra_body"] = {"top_k": int(top_k)}
    return out


@contextmanager
def trainer_engine(trainer: Any) -> Iterator[Any]:
    """An ``Engine`` over the generation the trainer is set up with, at its current weights."""
    tokenizer = trainer.processing_class
    step = int(trainer.state.global_step)
    if getattr(trainer, "use_vllm", False):
        args = trainer.args
        if args.vllm_mode == "server":
            from bridges.adapters.vllm.server import VLLMServerEngine

            base_url = args.vllm_server_base_url or f"http://{args.vllm_server_host}:{args.vllm_server_port}"
            yield VLLMServerEngine(base_url, tokenizer, weight_version=step)
        else:
            from bridges.adapters.vllm.colocate import VLLMColocateEngine

            yield VLLMColocateEngine(trainer.vllm_generation.llm, tokenizer, weight_version=step)
        return
    from trl.models import unwrap_model_for_generation

    from bridges.adapters.hf import HFEngine

    with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator) as model:
        was_training = model.training
        try:  # HFEngine switches the model to eval mode (no dropout while sampling); switch it back after
            engine = HFEngine(model, tokenizer, device=trainer.accelerator.device, name="trl-model")
            engine.weight_version = step
            yield engine
        finally:
            model.train(was_training)


def to_trl_sample(state: Any, renderer: Any, max_completion_length: int) -> dict[str, Any]:
    """One rollout as TRL's per-sample fields (a failed rollout: its ids kept, every one masked)."""
    split = prompt_completion(state, max_completion_length)
    if split is None:  # failed before the first model call: the rendered prompt and one masked end-of-turn id
        split = PromptCompletion(
            renderer.render_ids(state.prompt), [renderer.eos_token_id or 0], [0], [0.0], 0
        )
    return {
        "prompt_ids": split.prompt_ids,
        "completion_ids": split.completion_ids,
        "env_mask": split.mask,
        "logprobs": split.logprobs,
        SCORES_KEY: {**state_scores(state), "breaks": split.breaks},  # breaks: segments left out (samples/breaks)
    }


def trl_rollout_func(
    env: Environment,
    *,
    sampling_args: dict[str, Any] | None = None,
    model_name: str = "policy",
) -> RolloutFunc:
    """A ``rollout_func`` for ``GRPOTrainer`` that runs ``env``'s rollouts (pass as ``rollout_func=``).

    ``sampling_args`` override the per-turn settings derived from the trainer's config (e.g.
    ``{"max_tokens": 64}`` for short turns inside a longer ``max_completion_length``).
    """
    rows = RowIndex(env)

    def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        from bridges.client import EngineClient

        check_trainer(trainer)
        training = trainer.model.training
        n = trainer.num_generations if training else trainer.num_generations_eval
        if len(prompts) % n:
            raise ConfigError(f"TRL sent {len(prompts)} prompts, not a whole number of groups of {n}.")
        split = "train" if training else "eval"
        group_rows = [rows.row_for(prompts[i], split) for i in range(0, len(prompts), n)]
        max_len = int(trainer.args.max_completion_length)
        args = {**env.sampling_args, **trainer_sampling_args(trainer), **(sampling_args or {})}
        # a model turn's cap: the caller's, else the environment's, else the episode's; never above the episode's
        turn_cap = (sampling_args or {}).get("max_tokens", env.sampling_args.get("max_tokens", max_len))
        args["max_tokens"] = min(int(turn_cap), max_len)

        with trainer_engine(trainer) as engine:
            client = EngineClient(engine, model_name=model_name)

            async def run_all() -> list[Any]:
                try:
                    groups = await asyncio.gather(
                        *(run_group(env, row, client, n, args, model=model_name) for row in group_rows)
                    )
                finally:
                    await engine.aclose()
                return [state for group in groups for state in group.states]

            states = run_sync(run_all())
            samples = [to_trl_sample(s, client.renderer, max_len) for s in states]
        return {key: [s[key] for s in samples] for key in samples[0]}

    return rollout_func
