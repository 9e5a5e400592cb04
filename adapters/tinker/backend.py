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
import time
from collections import deque
from pathlib import Path
from typing import Any

from bridges.config import check_values, option
from bridges.errors import ConfigError, require_extra
from bridges.train_config import TrainConfig, rollout_sampling_args, shared_keys

LOSS_FNS = ("importance_sampling", "ppo", "cispo")
# Tinker trains a LoRA of a given rank with its own Adam: no warmup, accumulation, KL reference,
# LoRA alpha/dropout/targets or rollout process
SHARED_KEYS = shared_keys() - {
    "trainer.warmup_steps", "trainer.grad_accum_steps", "trainer.beta", "trainer.rollout_process",
    "trainer.lora_alpha", "trainer.lora_dropout", "trainer.lora_target_modules",
}  # fmt: skip
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

    @classmethod
    def from_config(cls, section: dict[str, Any]) -> TinkerOptions:
        """The ``tinker.*`` section typed and range-checked like every other key (one sentence on error)."""
        from omegaconf import OmegaConf
        from omegaconf.errors import OmegaConfBaseException

        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(section) - names)
        if unknown:
            raise ConfigError(f"unknown key 'tinker.{unknown[0]}'; valid keys: {', '.join(sorted(names))}.")
        try:
            options = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(cls), section))
        except OmegaConfBaseException as exc:
            detail = str(exc).splitlines()[0].rstrip(".")
            raise ConfigError(f"invalid value for config key 'tinker.{exc.full_key}': {detail}.") from None
        check_values(options, prefix="tinker.")
        return options  # type: ignore[return-value]

    def adam_params(self, trainer: Any) -> Any:
        """Tinker's AdamParams from the shared optimisation keys (sent with every optim_step)."""
        from tinker import types

        return types.AdamParams(
            learning_rate=trainer.learning_rate,
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


def validate(config: TrainConfig) -> None:
    """backend=tinker's checks before a server starts or a client connects."""
    from bridges.preflight import check_model

    options = check_config(config)
    if options.base_url == "local":
        check_model(config.model)  # a remote service names its own models


def check_config(config: TrainConfig) -> TinkerOptions:
    options = TinkerOptions.from_config(dict(config.tinker))
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
    return options


class Checkpoints:
    """``checkpoints.jsonl`` in the run folder: one line per ``save_state`` (step, data position, path)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / "checkpoints.jsonl"

    def latest(self) -> dict[str, Any] | None:
        if not self.path.exists():
            return None
        lines = [json.loads(x) for x in self.path.read_text().splitlines() if x.strip()]
        return lines[-1] if lines else None

    def record(self, step: int, position: int, path: str) -> None:
        with self.path.open("a") as fh:
            fh.write(json.dumps({"step": step, "data_position": position, "path": path}) + "\n")


def run(config: TrainConfig) -> int:
    options = check_config(config)
    require_extra("tinker", "tinker", "backend=tinker")
    os.environ.setdefault("TINKER_TELEMETRY", "0")
    server = None
    if options.base_url == "local":
        from bridges.adapters.tinker.server import start_local_server

        run_dir = Path(config.output_dir) / config.resolved_run_name
        server = start_local_server(config.model, run_dir / "tinker-server")
        options.base_url = server.url
    try:
        return asyncio.run(_train(config, options))
    finally:
        if server is not None:
            server.close()


async def _open_training(
    config: TrainConfig, service: Any, checkpoints: Checkpoints, base_model: str
) -> tuple[Any, int, int]:
    """The training client, resumed from the last ``save_state`` when asked, and its step and data position."""
    resume = checkpoints.latest() if config.resume else None
    if config.resume and resume is None:
        print(f"resume=true but {checkpoints.path} lists no checkpoint; starting from step 0.")
    if resume is None:
        training = await service.create_lora_training_client(
            base_model=base_model, rank=config.trainer.lora_rank or 32, seed=config.seed
        )
        return training, 0, 0
    training = await service.create_training_client_from_state_with_optimizer(resume["path"])
    step, position = int(resume["step"]), int(resume["data_position"])
    print(f"resumed from {resume['path']} (step {step}, data position {position})")
    return training, step, position


async def _optimize(
    training: Any, options: TinkerOptions, t: Any, adam: Any, samples: list[Any]
) -> tuple[dict[str, float], Any]:
    """``forward_backward`` and ``optim_step`` submitted back to back (Tinker runs them in order; we wait
    once), then a sampler on the new weights. Nothing to train: zeros and no new sampler."""
    from bridges.adapters.tinker.datums import sample_to_datum

    if not samples:
        return {"loss": 0.0, "optim/grad_norm": 0.0, "optim/lr": t.learning_rate}, None
    datums = [sample_to_datum(s) for s in samples]
    backward = training.forward_backward(datums, options.loss_fn, options.loss_fn_config(t))
    update = training.optim_step(adam)  # queued behind forward_backward on the service
    out, optim = await backward, await update
    result = {"loss": float(out.metrics.get("loss:sum", 0.0)), **(optim.metrics or {})}
    return result, await training.save_weights_and_get_sampling_client()


class _Sampling:
    """Starts a batch's rollouts through an ``EngineClient`` over a Tinker sampling client."""

    def __init__(
        self, config: TrainConfig, env: Any, tokenizer: Any, model: str, sampling_args: dict[str, Any]
    ):
        self.config, self.env, self.tokenizer, self.model = config, env, tokenizer, model
        self.dataset, self.sampling_args = env.get_dataset(), sampling_args

    def start(self, sampler: Any, version: int, step: int, position: int) -> asyncio.Task[Any]:
        from bridges.adapters.tinker.engine import TinkerEngine
        from bridges.client import EngineClient
        from bridges.workflows.advantages import advantage_method
        from bridges.workflows.batches import batch_seed, rows_at
        from bridges.workflows.rollouts import run_groups

        t = self.config.trainer
        client = EngineClient(
            TinkerEngine(sampler, self.tokenizer, weight_version=version), model_name=self.model
        )
        rows = rows_at(self.dataset, position, t.batch_size, self.config.seed)
        args = {**self.sampling_args, "seed": batch_seed(self.config.seed, step)}
        return asyncio.create_task(
            run_groups(
                self.env,
                rows,
                client,
                t.group_size,
                args,
                model=self.model,
                advantage=advantage_method(t.loss),
            )
        )


async def _train(config: TrainConfig, options: TinkerOptions) -> int:
    import tinker
    from transformers import AutoTokenizer

    from bridges.metrics import finish_run, renamed
    from bridges.registry import load_environment
    from bridges.tiny import resolve_model_path
    from bridges.workflows.batches import groups_to_samples, step_metrics
    from bridges.workflows.traces import open_run_files

    t = config.trainer
    run_dir = Path(config.output_dir) / config.resolved_run_name
    run_dir.mkdir(parents=True, exist_ok=True)
    env = load_environment(config.env, **config.env_args)
    env.max_concurrent = t.max_concurrent
    base_model = options.base_model or config.model
    checkpoints = Checkpoints(run_dir)
    service = tinker.ServiceClient(base_url=options.base_url)
    training, step, position = await _open_training(config, service, checkpoints, base_model)
    local = options.tokenizer or (resolve_model_path(config.model) if base_model == config.model else None)
    tokenizer = AutoTokenizer.from_pretrained(local) if local else training.get_tokenizer()
    sampling_args = rollout_sampling_args(config, env.sampling_args)  # temperature 1: check_config
    sampling = _Sampling(config, env, tokenizer, base_model, sampling_args)
    logger, traces = open_run_files(config, run_dir, "tinker", "tinker", base_model, sampling_args, step)
    adam = options.adam_params(t)
    sampler = await training.save_weights_and_get_sampling_client()
    pending: deque[asyncio.Task[Any]] = deque()
    next_step, next_position, started = step, position, time.perf_counter()
    try:
        while step < t.max_steps:
            while next_step < t.max_steps and len(pending) <= t.num_batches_ahead:
                pending.append(sampling.start(sampler, step, next_step, next_position))
                next_step, next_position = next_step + 1, next_position + t.batch_size
            waited = time.perf_counter()
            groups = await pending.popleft()
            waited = time.perf_counter() - waited
            for group in groups:
                traces.write_group(group, step=step + 1)
            samples, stats = groups_to_samples(groups, t.max_completion_length)
            trained = time.perf_counter()
            result, new_sampler = await _optimize(training, options, t, adam, samples)
            sampler = new_sampler or sampler
            step, position = step + 1, position + t.batch_size
            row = {"step": step, **step_metrics(groups, stats, step), **result, "datums": len(samples),
                   "timing/wait_generation_s": waited, "timing/train_s": time.perf_counter() - trained,
                   "timing/elapsed_s": time.perf_counter() - started}  # fmt: skip
            logger.log(renamed(row, TINKER_METRIC_NAMES))
            print(f"step {step}: reward={row['reward/mean'] or 0:.3f} datums={len(samples)} loss={result['loss']:.4f}",
                  flush=True)  # fmt: skip
            if (config.save_every > 0 and step % config.save_every == 0) or step == t.max_steps:
                checkpoints.record(step, position, (await training.save_state(f"step_{step:06d}")).path)
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        traces.close()
        logger.close()
    finish_run(logger.rows, run_dir, f"{config.env} · {base_model} · tinker",
               ["metrics.jsonl", "traces.jsonl", "checkpoints.jsonl"])  # fmt: skip
    return 0
