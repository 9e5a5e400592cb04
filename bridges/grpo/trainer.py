"""The bundled async GRPO trainer: ``python -m bridges.train backend=grpo`` (the default backend).

Read top to bottom: setup, one training step, the run. The loop itself (data order, the pipeline of
batches generated ahead, traces, metrics, save cadence, the non-finite guard) is
``workflows.run_loop``, shared with the Tinker backend, so the two cannot drift apart.

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
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from bridges.backends import Backend
from bridges.grpo.batching import collate
from bridges.grpo.checkpoint import resume_latest_intact, save_checkpoint
from bridges.grpo.loss import LossConfig, policy_loss, sequence_logprobs
from bridges.grpo.policy import load_policy, make_engine
from bridges.grpo.rollouts import InProcessRollouts, Rollouts
from bridges.train_config import TrainConfig, rollout_sampling_args, shared_keys
from bridges.workflows.advantages import advantage_method
from bridges.workflows.run_loop import RunPosition, RunSpec, run_training
from bridges.workflows.types import Group, TrainingSample

# --------------------------------------------------------------------------------------------------
# Setup: environment, policy, optimizer, engine


def validate(config: TrainConfig, options: None = None) -> None:
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
# The run: setup here, the loop itself is workflows.run_loop (shared with the Tinker backend)


def run(config: TrainConfig, options: None = None) -> int:
    return asyncio.run(_run(config))


@dataclasses.dataclass
class _Run:
    """Everything one run holds: the config, the data, the policy and its optimizer, where it writes."""

    config: TrainConfig
    env: Any
    dataset: Any
    tokenizer: Any
    ctx: StepContext
    start: RunPosition
    run_dir: Path
    sampling_args: dict[str, Any]


def _prepare(config: TrainConfig) -> _Run:
    """Seeds, environment, policy, optimizer and scheduler, resumed from the newest intact checkpoint."""
    from bridges.registry import load_environment

    t = config.trainer
    run_dir = Path(config.output_dir) / config.resolved_run_name
    random.seed(config.seed)
    torch.manual_seed(config.seed)
    if not torch.cuda.is_available() and "OMP_NUM_THREADS" not in os.environ:
        # Generation and training run in two threads at once; one intra-op thread each keeps them
        # from oversubscribing a small CPU (measured 10-20x slower with the default under load).
        torch.set_num_threads(1)
    env = load_environment(config.env, **config.env_args)
    env.max_concurrent = t.max_concurrent
    policy, tokenizer = load_policy(config)
    optimizer = torch.optim.AdamW(
        [p for p in policy.parameters() if p.requires_grad], lr=t.learning_rate, weight_decay=t.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / t.warmup_steps) if t.warmup_steps > 0 else 1.0
    )
    start = RunPosition()
    resumed = (
        resume_latest_intact(run_dir / "checkpoints", policy, optimizer, scheduler) if config.resume else None
    )
    if config.resume and resumed is None:
        print(f"resume=true but {run_dir / 'checkpoints'} has no checkpoint; starting from step 0.")
    if resumed is not None:
        start, resume_from = resumed
        print(f"resumed from {resume_from} (step {start.step}, data position {start.data_position})")
    sampling_args = rollout_sampling_args(config, env.sampling_args)
    ctx = StepContext(
        policy=policy,
        reference=copy.deepcopy(policy).eval().requires_grad_(False) if t.beta != 0.0 else None,
        optimizer=optimizer,
        scheduler=scheduler,
        loss_config=LossConfig(
            loss_type=advantage_method(t.loss),
            epsilon=t.epsilon,
            epsilon_high=t.epsilon_high,
            ratio_cap=t.ratio_cap,
            beta=t.beta,
            max_completion_length=t.max_completion_length,
        ),  # fmt: skip
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
        temperature=config.sampling.temperature,
        grad_accum_steps=t.grad_accum_steps,
        max_grad_norm=t.max_grad_norm,
    )
    return _Run(config, env, env.get_dataset(), tokenizer, ctx, start, run_dir, sampling_args)


def _rollouts(run: _Run) -> Rollouts:
    """In this process, or (``rollout_process=true``; validate() allowed it only with the hf engine) in a
    child process that owns its own copy of the weights."""
    config = run.config
    if config.trainer.rollout_process:
        from bridges.grpo.rollout_process import ProcessRollouts

        return ProcessRollouts(config, run.ctx.policy)
    engine = make_engine(config, run.ctx.policy, run.tokenizer)
    return InProcessRollouts(
        engine, run.env, config.trainer.group_size, config.model, advantage_method(config.trainer.loss)
    )


@dataclasses.dataclass
class _Learner:
    """The loop's view of this trainer: rollouts from ``Rollouts``, a step from ``train_step`` (in a
    worker thread, so the next batch keeps generating), checkpoints in ``<run>/checkpoints``."""

    run: _Run
    rollouts: Rollouts

    @property
    def weight_version(self) -> int:
        return self.rollouts.weight_version

    def start_batch(
        self, rows: list[dict[str, Any]], sampling_args: dict[str, Any]
    ) -> asyncio.Future[list[Group]]:
        return self.rollouts.start(rows, sampling_args)

    async def train(self, samples: list[TrainingSample]) -> dict[str, Any]:
        result: dict[str, Any] = await asyncio.to_thread(train_step, self.run.ctx, samples)
        if samples and not result["skipped_nonfinite"]:
            await self.rollouts.update_weights(self.run.ctx.policy)
        return {**result, "lr": self.run.ctx.scheduler.get_last_lr()[0]}

    async def save(self, position: RunPosition) -> None:
        run, ctx = self.run, self.run.ctx
        save_checkpoint(run.run_dir / "checkpoints", position, ctx.policy, ctx.optimizer, ctx.scheduler,
                        keep=run.config.keep_checkpoints, tokenizer=run.tokenizer)  # fmt: skip


async def _run(config: TrainConfig) -> int:
    run = _prepare(config)
    rollouts = _rollouts(run)
    spec = RunSpec(run.run_dir, "grpo", rollouts.name, config.model, run.dataset, run.sampling_args,
                   ["metrics.jsonl", "traces.jsonl", "checkpoints/"])  # fmt: skip
    try:
        await run_training(config, spec, _Learner(run, rollouts), run.start)
    finally:
        await rollouts.aclose()
    return 0


# the bundled trainer reads every shared key and has no section of its own
BACKEND = Backend(name="grpo", run=run, honoured_keys=shared_keys(), validate=validate)
