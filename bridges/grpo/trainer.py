"""The bundled async GRPO trainer: ``python -m bridges.train backend=grpo`` (the default backend).

Read top to bottom: setup, one training step, the async loop, the end of the run (the data order,
sample selection and step metrics every backend shares live in ``workflows.batches``).

Included
- GRPO with group-relative advantages over the *valid* rollouts of each group (``grpo``:
  (r - mean) / (std + eps); ``dr_grpo``: r - mean with the constant-length normaliser of Dr. GRPO).
- PPO-style clipped importance ratio against the engine's own sampled logprobs (the behaviour
  policy), asymmetric clip (``epsilon_high``) and two-sided truncation (``ratio_cap``). This is the
  off-policy correction that makes ``num_batches_ahead > 0`` sound: generation of step k+1 overlaps
  training on step k, so samples are up to ``num_batches_ahead`` weight versions old.
- Optional KL to a frozen reference model (``beta``, k3 estimator), gradient accumulation, max grad
  norm, linear warmup, full fine-tuning or peft LoRA.
- Rollouts in the trainer's process, or (``rollout_process=true``) in a child process that takes
  new weights through shared memory, so on a CPU generation overlaps training for real.
- Failure isolation from ``workflows``: a failed rollout is a masked group member, a group with no
  reward variance or < 2 valid members contributes no gradient; both are counted.
- Checkpoints (weights/adapter, optimizer, scheduler, step, data position, RNG) and exact resume;
  traces of every episode; metrics.jsonl, console, wandb, and a PNG reward curve.

Left out, on purpose
- Multiple optimisation epochs per batch (``num_iterations``): with a fresh batch every step and
  async generation the extra epochs buy little and need a recomputed "old" policy.
- Entropy bonus, length penalties, dynamic sampling (DAPO's resampling of zero-variance groups):
  they are policy choices a user can add in the environment's rubric or in a fork of this file.
- Sequence packing and multi-GPU sharding: the loop stays readable; large jobs belong on verl.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import math
import os
import random
import time
from collections import defaultdict, deque
from pathlib import Path
from typing import Any

import torch

from bridges.errors import TrainingDivergedError
from bridges.grpo.batching import collate
from bridges.grpo.checkpoint import TrainerState, resume_latest_intact, save_checkpoint
from bridges.grpo.loss import LossConfig, policy_loss, sequence_logprobs
from bridges.grpo.policy import load_policy, make_engine, sync_weights
from bridges.metrics import MetricsLogger, finish_run
from bridges.train_config import TrainConfig
from bridges.workflows.advantages import advantage_method
from bridges.workflows.batches import groups_to_samples, rows_at, step_metrics
from bridges.workflows.rollouts import run_groups
from bridges.workflows.traces import TraceWriter
from bridges.workflows.types import Group, TrainingSample

MAX_NONFINITE_STEPS = 3  # skipped non-finite steps in a row before the run stops

# --------------------------------------------------------------------------------------------------
# Setup: environment, policy, optimizer, engine


def validate(config: TrainConfig) -> None:
    """backend=grpo's own checks, before any model loads: the model, the engine, and a resume that
    matches how the checkpoint was trained (full weights or a LoRA adapter)."""
    from bridges.errors import ConfigError, require_extra
    from bridges.grpo.checkpoint import intact_checkpoints, is_adapter_checkpoint, no_intact_checkpoint
    from bridges.preflight import check_lora_targets, check_model

    check_model(config.model)
    if config.engine == "vllm":
        require_extra("vllm", "vllm", "engine=vllm")
    if config.trainer.rollout_process and (
        config.engine == "vllm" or (config.engine == "auto" and torch.cuda.is_available())
    ):
        raise ConfigError(
            "trainer.rollout_process=true runs the hf engine in a child process; set engine=hf."
        )
    if config.resume:
        ckpt_dir = Path(config.output_dir) / config.resolved_run_name / "checkpoints"
        intact, damaged = intact_checkpoints(ckpt_dir)
        if damaged and not intact:
            raise no_intact_checkpoint(ckpt_dir, damaged)
        if intact and is_adapter_checkpoint(intact[0]) != (config.trainer.lora_rank > 0):
            kind = "a LoRA adapter" if is_adapter_checkpoint(intact[0]) else "full weights"
            raise ConfigError(
                f"resume=true but {intact[0].name} holds {kind} and trainer.lora_rank={config.trainer.lora_rank}; "
                "resume with the lora_rank the run was started with."
            )
    if config.trainer.lora_rank > 0:
        require_extra("peft", "trl", "LoRA training (trainer.lora_rank > 0)")
        check_lora_targets(config.model, config.trainer.lora_target_modules)


# --------------------------------------------------------------------------------------------------
# One optimizer step on the samples of one batch (runs in a worker thread, off the event loop)


@dataclasses.dataclass
class StepContext:
    policy: torch.nn.Module
    reference: torch.nn.Module | None
    optimizer: torch.optim.Optimizer
    scheduler: Any
    loss_config: LossConfig
    pad_token_id: int
    temperature: float
    grad_accum_steps: int
    max_grad_norm: float


def train_step(ctx: StepContext, samples: list[TrainingSample]) -> dict[str, float]:
    """Accumulate the policy loss over micro-batches, clip, step. No samples -> no update."""
    if not samples:
        return {"loss": 0.0, "grad_norm": 0.0, "clip_fraction": 0.0, "ratio/mean": 1.0, "kl": 0.0,
                "skipped_nonfinite": 0.0}  # fmt: skip
    ctx.policy.train()
    chunks = [samples[i :: ctx.grad_accum_steps] for i in range(ctx.grad_accum_steps)]
    chunks = [c for c in chunks if c]
    totals: dict[str, float] = defaultdict(float)
    for chunk in chunks:
        batch = collate(chunk, ctx.pad_token_id)
        logps_B_T = sequence_logprobs(
            ctx.policy, batch.input_ids_B_L, batch.attention_mask_B_L, ctx.temperature
        )
        ref_logps_B_T = None
        if ctx.reference is not None:
            with torch.no_grad():
                ref_logps_B_T = sequence_logprobs(
                    ctx.reference, batch.input_ids_B_L, batch.attention_mask_B_L, ctx.temperature
                )
        out = policy_loss(
            logps_B_T,
            batch.sampler_logps_B_T,
            batch.advantages_B,
            batch.loss_mask_B_T,
            ctx.loss_config,
            ref_logps_B_T,
        )
        (out.loss / len(chunks)).backward()
        totals["loss"] += float(out.loss.detach()) / len(chunks)
        totals["clip_fraction"] += out.clip_fraction / len(chunks)
        totals["ratio/mean"] += out.mean_ratio / len(chunks)
        totals["kl"] += out.kl / len(chunks)
    params = [p for p in ctx.policy.parameters() if p.requires_grad]
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, ctx.max_grad_norm))
    # One non-finite step would turn every weight into NaN for good: skip it (the loop stops the run
    # after MAX_NONFINITE_STEPS in a row, which means something upstream is broken).
    skipped = not (math.isfinite(totals["loss"]) and math.isfinite(grad_norm))
    if not skipped:
        ctx.optimizer.step()
        ctx.scheduler.step()
    ctx.optimizer.zero_grad(set_to_none=True)
    ctx.policy.eval()
    return {**totals, "grad_norm": grad_norm, "skipped_nonfinite": float(skipped)}


# --------------------------------------------------------------------------------------------------
# The run


def run(config: TrainConfig) -> int:
    return asyncio.run(_run(config))


async def _run(config: TrainConfig) -> int:
    from bridges.client import EngineClient
    from bridges.registry import load_environment

    t = config.trainer
    run_dir = Path(config.output_dir) / config.resolved_run_name
    ckpt_dir = run_dir / "checkpoints"
    random.seed(config.seed)
    torch.manual_seed(config.seed)
    if not torch.cuda.is_available() and "OMP_NUM_THREADS" not in os.environ:
        # Generation and training run in two threads at once; one intra-op thread each keeps them
        # from oversubscribing a small CPU (measured 10-20x slower with the default under load).
        torch.set_num_threads(1)

    env = load_environment(config.env, **config.env_args)
    env.max_concurrent = t.max_concurrent
    dataset = env.get_dataset()
    policy, tokenizer = load_policy(config)
    reference = copy.deepcopy(policy).eval().requires_grad_(False) if t.beta != 0.0 else None
    optimizer = torch.optim.AdamW(
        [p for p in policy.parameters() if p.requires_grad], lr=t.learning_rate, weight_decay=t.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / t.warmup_steps) if t.warmup_steps > 0 else 1.0
    )

    state = TrainerState()
    resumed = resume_latest_intact(ckpt_dir, policy, optimizer, scheduler) if config.resume else None
    if config.resume and resumed is None:
        print(f"resume=true but {ckpt_dir} has no checkpoint; starting from step 0.")
    if resumed is not None:
        state, resume_from = resumed
        print(f"resumed from {resume_from} (step {state.step}, data position {state.data_position})")

    # Rollouts run here (engine + client on this event loop) or, with rollout_process=true, in a child
    # process that owns its own copy of the weights (bridges/grpo/rollout_process.py).
    worker = None
    if t.rollout_process:  # engine=hf here: validate() refused anything else
        from bridges.grpo.rollout_process import ProcessRollouts

        worker = ProcessRollouts(config, policy)
        engine = client = None
    else:
        engine = make_engine(config, policy, tokenizer)
        client = EngineClient(engine, model_name=config.model)
    sampling_args: dict[str, Any] = {**(env.sampling_args or {})}
    if config.sampling.max_tokens is not None:
        sampling_args["max_tokens"] = config.sampling.max_tokens
    sampling_args.update(temperature=config.sampling.temperature, top_p=config.sampling.top_p)
    ctx = StepContext(
        policy=policy,
        reference=reference,
        optimizer=optimizer,
        scheduler=scheduler,
        loss_config=LossConfig(
            loss_type=t.loss,  # type: ignore[arg-type]
            epsilon=t.epsilon,
            epsilon_high=t.epsilon_high,
            ratio_cap=t.ratio_cap,
            beta=t.beta,
            max_completion_length=t.max_completion_length,
        ),
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
        temperature=config.sampling.temperature,
        grad_accum_steps=t.grad_accum_steps,
        max_grad_norm=t.max_grad_norm,
    )
    logger = MetricsLogger(run_dir, dataclasses.asdict(config), config.report_to, resume_step=state.step)
    traces = TraceWriter(
        run_dir / "traces.jsonl",
        {
            "backend": "grpo",
            "engine": worker.name if worker is not None else getattr(engine, "name", type(engine).__name__),
            "model": config.model,
            "env_id": config.env,
            "env_args": config.env_args,
            "sampling_args": sampling_args,
            "seed": config.seed,
        },
        resume_step=state.step,
    )

    def generate(step: int, position: int) -> asyncio.Future[list[Group]]:
        """Start generating the batch of ``step`` (rows from ``position``) with seeded sampling."""
        rows = rows_at(dataset, position, t.batch_size, config.seed)
        args = {**sampling_args, "seed": config.seed * 7919 + step}
        if worker is not None:
            return worker.start(rows, args)
        return asyncio.create_task(
            run_groups(
                env, rows, client, t.group_size, args, model=config.model, advantage=advantage_method(t.loss)
            )
        )

    def weight_version() -> int:
        source: Any = worker if worker is not None else engine
        return int(source.weight_version)

    # Async pipeline: batches for the next `num_batches_ahead` steps are already generating while we
    # train; each is tagged with its step so its seeds and data rows do not depend on timing.
    pending: deque[tuple[int, asyncio.Future[list[Group]]]] = deque()
    next_step, next_position = state.step, state.data_position
    nonfinite_in_a_row = 0
    progress = _progress_bar(config.progress, t.max_steps, state.step)
    started = time.perf_counter()
    try:
        while state.step < t.max_steps:
            while next_step < t.max_steps and len(pending) <= t.num_batches_ahead:
                pending.append((next_step, generate(next_step, next_position)))
                next_step, next_position = next_step + 1, next_position + t.batch_size
            gen_started = time.perf_counter()
            _, task = pending.popleft()
            groups = await task
            waited = time.perf_counter() - gen_started
            for group in groups:
                traces.write_group(group, step=state.step + 1)
            samples, stats = groups_to_samples(groups, t.max_completion_length)
            train_started = time.perf_counter()
            result = await asyncio.to_thread(train_step, ctx, samples)
            nonfinite_in_a_row = nonfinite_in_a_row + 1 if result["skipped_nonfinite"] else 0
            if nonfinite_in_a_row >= MAX_NONFINITE_STEPS:
                raise TrainingDivergedError(
                    f"training stopped at step {state.step + 1}: {nonfinite_in_a_row} steps in a row had a "
                    f"non-finite loss or gradient norm (last loss {result['loss']}, grad_norm "
                    f"{result['grad_norm']}), so none was applied; lower trainer.learning_rate or check the "
                    "environment's rewards. The weights are those of the last finite step."
                )
            if samples and not result["skipped_nonfinite"]:
                await (worker.update_weights(policy) if worker is not None else sync_weights(engine, policy))
            train_s = time.perf_counter() - train_started
            state = TrainerState(step=state.step + 1, data_position=state.data_position + t.batch_size)
            row = {
                "step": state.step,
                **step_metrics(groups, stats, weight_version()),
                **result,
                "lr": scheduler.get_last_lr()[0],
                "timing/wait_generation_s": waited,
                "timing/train_s": train_s,
                "timing/elapsed_s": time.perf_counter() - started,
                "weight_version": weight_version(),
            }
            logger.log(row)
            _report(progress, row)
            if (config.save_every > 0 and state.step % config.save_every == 0) or state.step == t.max_steps:
                save_checkpoint(
                    ckpt_dir,
                    state,
                    policy,
                    optimizer,
                    scheduler,
                    keep=config.keep_checkpoints,
                    tokenizer=tokenizer,
                )
    finally:
        for _, task in pending:
            task.cancel()
        await asyncio.gather(*(task for _, task in pending), return_exceptions=True)
        traces.close()
        logger.close()
        if progress is not None:
            progress.close()
        await _close(worker if worker is not None else engine)
    finish_run(
        logger.rows,
        run_dir,
        f"{config.env} · {config.model} · grpo",
        ["metrics.jsonl", "traces.jsonl", "checkpoints/"],
    )
    return 0


def _progress_bar(enabled: bool, total: int, initial: int) -> Any:
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc="grpo", unit="step", dynamic_ncols=True)


def _report(progress: Any, row: dict[str, Any]) -> None:
    reward = row.get("reward/mean")
    text = f"reward={reward:.3f}" if reward is not None else "reward=n/a"
    if progress is not None:
        progress.set_postfix_str(f"{text} loss={row['loss']:.4f} masked={row['episodes/masked']}")
        progress.update(1)
    else:
        print(
            f"step {row['step']}: {text} loss={row['loss']:.4f} masked={row['episodes/masked']}", flush=True
        )


async def _close(engine: Any) -> None:
    closer = getattr(engine, "aclose", None)
    if closer is not None:
        await closer()
