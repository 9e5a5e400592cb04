"""``python -m bridges.train backend=tinker``: LoRA RL on a Tinker service, or on the local one.

One step: the batch's groups are rolled out through an ``EngineClient`` over the current Tinker
sampling client, the groups that carry signal become ``Datum``s, ``forward_backward`` and
``optim_step`` are submitted back to back (Tinker runs them in order; we wait once), and a new
sampling client is taken from the new weights. With ``trainer.num_batches_ahead=k`` the next k
batches are already being sampled (from the weights of their time) while a step trains; the
loss's importance ratio against the sampler's logprobs is what makes that sound.

Settings (``tinker.*``): ``base_url`` (``local`` starts ``adapters.tinker.server`` in-process on the
``model``), ``base_model`` (the service's model name; default ``model``), ``loss_fn``
(``importance_sampling`` | ``ppo`` | ``cispo``; ppo clips at ``trainer.epsilon``/``epsilon_high``,
cispo truncates at ``trainer.ratio_cap``), ``tokenizer`` (a local tokenizer folder for remote runs that must not reach the Hugging Face hub).
``TINKER_API_KEY`` comes from the environment. Temperature must be 1: Tinker's sampler reports
logprobs of the untempered distribution, so any other temperature would make every step silently
off-policy.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from bridges.runs.backends import Backend, typed_options, typed_section_help
from bridges.runs.config import option
from bridges.runs.train_config import TrainConfig, rollout_sampling_args, shared_keys
from bridges.runtime.errors import ConfigError, require_extra
from bridges.workflows.run_loop import RunPosition, RunSpec, eval_rows, run_training

LOSS_FNS = ("importance_sampling", "ppo", "cispo")
# Tinker trains a LoRA of a given rank with its own Adam: no warmup, accumulation, KL reference,
# LoRA alpha/dropout/targets or rollout process
HONOURED_KEYS = shared_keys() - {
    "trainer.warmup_steps", "trainer.grad_accum_steps", "trainer.beta", "trainer.rollout_process",
    "trainer.lora_alpha", "trainer.lora_dropout", "trainer.lora_target_modules",
    # the service (or the local server: CUDA when visible) decides where and how the model trains
    "trainer.device", "trainer.dtype", "trainer.gradient_checkpointing", "trainer.logprob_chunk_tokens",
    "trainer.num_processes", "trainer.strategy", "trainer.micro_batch_tokens", "trainer.kernels",
    "trainer.peer_timeout_s",
}
# the local server's (and Tinker's) optimizer metrics under the names every backend uses
TINKER_METRIC_NAMES = {"optim/grad_norm": "grad_norm", "optim/lr": "lr", "optim/skipped": "skipped_nonfinite"}


@dataclasses.dataclass
class TinkerOptions:
    base_url: str | None = option(
        None, help="None: $TINKER_BASE_URL or Tinker's service; 'local': our own server"
    )
    base_model: str | None = option(None, help="the service's model name; default: model")
    loss_fn: str = option("importance_sampling", choices=LOSS_FNS, help="Tinker's built-in RL loss")
    tokenizer: str | None = option(None, help="a local tokenizer folder for remote runs")
    adam_beta2: float = option(0.999, gt=0.0, le=0.999999, help="Adam beta2")
    adam_eps: float = option(1e-8, gt=0.0, help="Adam epsilon")

    def adam_params(self, trainer: Any, model: str) -> Any:
        """Tinker's AdamParams from the shared optimisation keys (sent with every optim_step); Tinker
        trains LoRA adapters, so an unset learning rate takes the LoRA default."""
        from tinker import types

        from bridges.runs.train_config import learning_rate

        return types.AdamParams(
            learning_rate=learning_rate(trainer, model, lora=True),
            beta1=0.9,
            beta2=self.adam_beta2,
            eps=self.adam_eps,
            weight_decay=trainer.weight_decay,
            grad_clip_norm=trainer.max_grad_norm,
        )

    def loss_fn_config(self, trainer: Any) -> dict[str, float] | None:
        """Clip thresholds from the shared keys, as the other backends read them: ppo keeps the ratio in
        [1 - epsilon, 1 + epsilon_high]; cispo truncates it at ``ratio_cap`` (its default when None)."""
        if self.loss_fn == "ppo":
            high = trainer.epsilon_high if trainer.epsilon_high is not None else trainer.epsilon
            return {
                "clip_low_threshold": 1.0 - float(trainer.epsilon),
                "clip_high_threshold": 1.0 + float(high),
            }
        if self.loss_fn == "cispo" and trainer.ratio_cap is not None:
            return {"clip_low_threshold": 0.0, "clip_high_threshold": float(trainer.ratio_cap)}
        return None


def validate(config: TrainConfig, options: TinkerOptions) -> None:
    """backend=tinker's checks before a server starts or a client connects."""
    from bridges.runs.preflight import check_model

    require_extra("tinker", "tinker", "backend=tinker")  # a dry run says so too, not only a real run

    default_cap = type(config.trainer)().ratio_cap
    if options.loss_fn != "cispo" and config.trainer.ratio_cap != default_cap:
        raise ConfigError(
            f"trainer.ratio_cap={config.trainer.ratio_cap} has no place in Tinker's {options.loss_fn} loss, a "
            "built-in of the service with no ratio cap; use tinker.loss_fn=cispo, which truncates at the cap, "
            "or leave trainer.ratio_cap at its default."
        )
    defaults, t = type(config.trainer)(), config.trainer
    clip = next((f"trainer.{k}={getattr(t, k)}" for k in ("epsilon", "epsilon_high")
                 if getattr(t, k) != getattr(defaults, k)), None)
    if clip is not None and options.loss_fn != "ppo":
        raise ConfigError(
            f"{clip} has no place in Tinker's {options.loss_fn} loss, which does not clip the ratio; use "
            "tinker.loss_fn=ppo, which clips at trainer.epsilon/epsilon_high, or leave them at their defaults."
        )
    if config.sampling.temperature != 1.0:
        raise ConfigError(
            f"sampling.temperature={config.sampling.temperature} is refused on Tinker: its sampler reports "
            "logprobs of the untempered distribution, so the importance ratio would be wrong; use 1.0."
        )
    if options.base_url != "local" and not os.environ.get("TINKER_API_KEY"):
        raise ConfigError(
            "TINKER_API_KEY is not set; export your Tinker API key, or train on the local server with "
            "tinker.base_url=local."
        )
    if options.base_url == "local":
        check_model(config.model)  # a remote service names its own models


DEFAULT_RANK = 32  # Tinker's own default LoRA rank


def adapter_rank(config: TrainConfig) -> tuple[int, str]:
    """The LoRA rank Tinker trains and the line that says where it came from: Tinker trains adapters
    only, so ``trainer.lora_rank=0`` (full fine-tuning elsewhere) takes Tinker's default, said aloud."""
    rank = config.trainer.lora_rank
    if rank > 0:
        return rank, f"Tinker trains a LoRA adapter of rank {rank} (trainer.lora_rank)."
    return DEFAULT_RANK, (
        f"Tinker trains LoRA adapters only: trainer.lora_rank=0 (full fine-tuning) is not offered, so the "
        f"adapter takes Tinker's default rank {DEFAULT_RANK}; set trainer.lora_rank=64 (say) for another."
    )


def describe(config: TrainConfig, options: TinkerOptions) -> str:
    """What ``dry_run=true`` adds: the adapter's rank and where it comes from."""
    return adapter_rank(config)[1] + "\n"


class Checkpoints:
    """``checkpoints.jsonl`` in the run folder: one line per ``save_state`` (step, data position, path)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / "checkpoints.jsonl"

    def latest(self) -> dict[str, Any] | None:
        if not self.path.exists():
            return None
        lines = [json.loads(x) for x in self.path.read_text().splitlines() if x.strip()]
        return lines[-1] if lines else None

    def record(self, position: RunPosition, path: str) -> None:
        with self.path.open("a") as fh:
            fh.write(
                json.dumps({"step": position.step, "data_position": position.data_position, "path": path})
                + "\n"
            )


def run(config: TrainConfig, options: TinkerOptions) -> int:
    require_extra("tinker", "tinker", "backend=tinker")
    os.environ.setdefault("TINKER_TELEMETRY", "0")
    server = None
    if options.base_url == "local":
        from bridges.adapters.tinker.server import start_local_server

        run_dir = Path(config.output_dir) / config.resolved_run_name
        server = start_local_server(config.model, run_dir / "tinker-server")
        options = dataclasses.replace(options, base_url=server.url)
    try:
        return asyncio.run(_train(config, options))
    finally:
        if server is not None:
            server.close()


async def _open_training(
    config: TrainConfig, service: Any, checkpoints: Checkpoints, base_model: str
) -> tuple[Any, RunPosition]:
    """The training client, resumed from the last ``save_state`` when asked, and where the run stands."""
    resume = checkpoints.latest() if config.resume else None
    if config.resume and resume is None:
        print(f"resume=true but {checkpoints.path} lists no checkpoint; starting from step 0.")
    if resume is None:
        rank, said = adapter_rank(config)
        print(said, flush=True)
        training = await service.create_lora_training_client(
            base_model=base_model, rank=rank, seed=config.seed
        )
        return training, RunPosition()
    training = await service.create_training_client_from_state_with_optimizer(resume["path"])
    start = RunPosition(int(resume["step"]), int(resume["data_position"]))
    print(f"resumed from {resume['path']} (step {start.step}, data position {start.data_position})")
    return training, start


class _Learner:
    """The loop's view of a Tinker training client: batches sample through an ``EngineClient`` over the
    current sampling client; a step is ``forward_backward`` + ``optim_step`` submitted back to back
    (Tinker runs them in order; we wait once), then a sampler on the new weights."""

    def __init__(self, config: TrainConfig, options: TinkerOptions, env: Any, tokenizer: Any, model: str,
                 training: Any, checkpoints: Checkpoints, start: RunPosition) -> None:
        self.config, self.options, self.env, self.tokenizer, self.model = (
            config,
            options,
            env,
            tokenizer,
            model,
        )
        self.training, self.checkpoints = training, checkpoints
        self.adam = options.adam_params(config.trainer, config.model)
        self.sampler: Any = None
        self.weight_version = start.step  # one sampler per applied step

    def start_batch(self, rows: list[dict[str, Any]], sampling_args: dict[str, Any]) -> asyncio.Task[Any]:
        from bridges.adapters.tinker.engine import TinkerEngine
        from bridges.client import EngineClient
        from bridges.workflows.advantages import advantage_method
        from bridges.workflows.rollouts import run_groups

        t = self.config.trainer
        engine = TinkerEngine(self.sampler, self.tokenizer, weight_version=self.weight_version)
        client = EngineClient(engine, model_name=self.model)
        return asyncio.create_task(
            run_groups(self.env, rows, client, t.group_size, sampling_args, model=self.model,
                       advantage=advantage_method(t.loss))
        )

    async def train(self, samples: list[Any]) -> dict[str, Any]:
        from bridges.adapters.tinker.datums import sample_to_datum, token_weights
        from bridges.runs.metrics import renamed

        t = self.config.trainer
        if not samples:
            return {"loss": 0.0, "grad_norm": 0.0, "lr": self.adam.learning_rate, "datums": 0}
        weights = token_weights(samples, t.loss_aggregation, t.loss, t.max_completion_length)
        datums = [sample_to_datum(s, w) for s, w in zip(samples, weights, strict=True)]
        backward = self.training.forward_backward(
            datums, self.options.loss_fn, self.options.loss_fn_config(t)
        )
        update = self.training.optim_step(self.adam)  # queued behind forward_backward on the service
        out, optim = await backward, await update
        self.sampler = await self.training.save_weights_and_get_sampling_client()
        self.weight_version += 1
        result = {
            "loss": float(out.metrics.get("loss:sum", 0.0)),
            **(optim.metrics or {}),
            "datums": len(datums),
        }
        return renamed(result, TINKER_METRIC_NAMES)

    async def save(self, position: RunPosition) -> None:
        saved = await self.training.save_state(f"step_{position.step:06d}")
        self.checkpoints.record(position, saved.path)


async def _train(config: TrainConfig, options: TinkerOptions) -> int:
    from transformers import AutoTokenizer

    from bridges.adapters.tinker.session import open_service
    from bridges.envs.registry import load_environment
    from bridges.models.tiny import resolve_model_path

    run_dir = Path(config.output_dir) / config.resolved_run_name
    run_dir.mkdir(parents=True, exist_ok=True)
    env = load_environment(config.env, **config.env_args)
    env.max_concurrent = config.trainer.max_concurrent
    base_model = options.base_model or config.model
    checkpoints = Checkpoints(run_dir)
    with open_service(options.base_url) as service:
        training, start = await _open_training(config, service, checkpoints, base_model)
        local = options.tokenizer or (resolve_model_path(config.model) if base_model == config.model else None)
        tokenizer = AutoTokenizer.from_pretrained(local) if local else training.get_tokenizer()
        learner = _Learner(config, options, env, tokenizer, base_model, training, checkpoints, start)
        learner.sampler = await training.save_weights_and_get_sampling_client()
        sampling_args = rollout_sampling_args(config, env.sampling_args)  # temperature 1: validate()
        spec = RunSpec(run_dir, "tinker", "tinker", base_model, env.get_dataset(), sampling_args,
                       ["metrics.jsonl", "traces.jsonl.gz", "checkpoints.jsonl"], rows_together=env.rows_together,
                       eval_dataset=eval_rows(config, env), reward_names=tuple(env.rubric.get_reward_func_names()))
        await run_training(config, spec, learner, start)
    return 0


BACKEND = Backend(
    name="tinker", run=run, honoured_keys=HONOURED_KEYS, parse_options=typed_options(TinkerOptions, "tinker"),
    validate=validate, describe=describe, section_help=typed_section_help(TinkerOptions, "tinker"),
)
