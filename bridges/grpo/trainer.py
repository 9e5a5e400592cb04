"""The bundled async GRPO trainer: ``python -m bridges.train backend=grpo`` (the default backend).

Read top to bottom: setup, one training step, the run. The loop itself (data order, the pipeline of
batches generated ahead, traces, metrics, save cadence, held-out evaluation, the non-finite guard) is
``workflows.run_loop``, shared with the Tinker backend, so the two cannot drift apart. The lines
that exist only for several processes are marked ``[distributed]``; with one process they do nothing.

Included
- GRPO with group-relative advantages over the *valid* rollouts of each group (``grpo``:
  (r - mean) / (std + eps); ``dr_grpo``: r - mean with the constant-length normaliser of Dr. GRPO).
- PPO-style clipped importance ratio against the engine's own sampled logprobs (the behaviour
  policy), asymmetric clip (``epsilon_high``) and two-sided truncation (``ratio_cap``). This is the
  off-policy correction that makes ``num_batches_ahead > 0`` sound: generation of step k+1 overlaps
  training on step k, so samples are up to ``num_batches_ahead`` weight versions old.
- Optional KL to a frozen reference model (``beta``, k3 estimator), gradient accumulation, max grad
  norm, linear warmup, full fine-tuning or peft LoRA.
- Where it runs (``bridges.models.hardware``): ``trainer.device`` (auto = CUDA when visible) for the policy,
  the reference model, the optimizer state, every batch tensor and the hf engine.
- Precision (``trainer.dtype``, auto = bf16 on a CUDA device that has it, fp32 on a CPU): the model
  computes in that dtype and the engine samples from the same half weights, so the first importance
  ratio is 1; the optimizer steps fp32 masters with fp32 moments (``precision.py``); logprobs and the
  loss are fp32; fp16 adds dynamic loss scaling. On the CPU the first step's logprobs are within
  1e-2 of fp32's, its loss within 1e-3 and its gradient norm within 1%
  (``tests/grpo/test_precision_and_resume.py``).
- Memory: the sampled ids' logprobs never hold all B×T×V logits (``bridges.models.token_logprobs``: the
  vocabulary projection in chunks of ``trainer.logprob_chunk_tokens`` loss positions, recomputed in the
  backward), recomputation of every or every k-th decoder layer (``trainer.gradient_checkpointing``),
  sdpa attention (flash-attention 2 on CUDA when installed), AdamW one tensor at a time.
- Speed: packed micro-batches without padding (``trainer.micro_batch_tokens``: one row per micro-batch
  under varlen flash-attention, else rows as long as the longest sequence; positions restarting per
  sequence) and compiled decoder layers (``trainer.kernels=compile``).
- Several processes (``trainer.num_processes=N``, or under torchrun / accelerate launch): each process
  rolls out and trains its share of every step's groups (a group never splits), then only gradients
  (``ddp``: one fp32 all-reduce; ``fsdp``: FSDP2's reduce-scatter) and metrics cross (``parallel.py``).
  One process writes metrics and checkpoints; every process appends its own episodes to the traces.
- Rollouts in the trainer's process, or (``rollout_process=true``, one CPU process) in a child process
  that takes new weights through shared memory, so on a CPU generation overlaps training for real,
  or (``inference=server``) on ``bridges.serve`` servers the trainer pushes each step's weights to
  (an HTTP body, or broadcasts over NCCL/gloo: ``push_channels.py``), a group pinned to one server
  (``server_rollouts.py``).
- Failure isolation from ``workflows``: a failed rollout is a masked group member, a group with no
  reward variance or < 2 valid members contributes no gradient; both are counted.
- Checkpoints (weights/adapter, fp32 trained tensors, optimizer, scheduler, step, data position, RNG)
  and exact resume, under another number of processes too; traces of every episode; metrics.jsonl,
  console, wandb, and a PNG reward curve.

Left out, on purpose
- Multiple optimisation epochs per batch (``num_iterations``): with a fresh batch every step and
  async generation the extra epochs buy little and need a recomputed "old" policy.
- Entropy bonus, length penalties, dynamic sampling (DAPO's resampling of zero-variance groups):
  they are policy choices a user can add in the environment's rubric or in a fork of this file.
- Tensor and pipeline parallelism, DeepSpeed: the loop stays readable; FSDP2 shards what ZeRO-3
  shards, and models that need more than sharding belong on verl.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import math
import os
import random
from pathlib import Path
from typing import Any, cast

import torch

from bridges.grpo.batching import collate, pack_micro_batches, padding_sample
from bridges.grpo.checkpoint import resume_latest_intact, save_checkpoint
from bridges.grpo.engine_shape import batch_shape
from bridges.grpo.loss import LossConfig, LossOutput, policy_loss, sequence_logprobs
from bridges.grpo.parallel import (
    World,
    barrier,
    check_agreement,
    check_shared_run_folder,
    combine_tallies,
    full_state_dict,
    grad_norm_value,
    loss_weight,
    reduce_max,
    reduce_sum,
    shard,
    sum_gradients,
    world_from_env,
)
from bridges.grpo.parallel import start as start_processes
from bridges.grpo.parallel import stop as stop_processes
from bridges.grpo.peers import PeerWatch, watched
from bridges.grpo.policy import load_policy, make_engine, trainable_names
from bridges.grpo.precision import DynamicLossScale, MasterWeights, make_optimizer, make_scaler
from bridges.grpo.rollouts import InProcessRollouts, Rollouts
from bridges.grpo.step_memory import step_reserve_bytes
from bridges.models.hardware import Placement, bound, memory_metrics, placement
from bridges.models.token_logprobs import chunked_matches_plain, default_chunk_tokens, varlen_attention
from bridges.runs.backends import Backend
from bridges.runs.train_config import TrainConfig, batches_ahead, rollout_sampling_args, shared_keys
from bridges.workflows.advantages import advantage_method
from bridges.workflows.run_loop import RunPosition, RunSpec, eval_rows, run_training
from bridges.workflows.types import Group, TrainingSample

# --------------------------------------------------------------------------------------------------
# Setup: environment, policy, optimizer, engine


def validate(config: TrainConfig, options: None = None) -> None:
    """backend=grpo's own checks, before any model loads: the model, the engine, and a resume that
    matches how the checkpoint was trained (full weights or a LoRA adapter)."""
    from bridges.grpo.checkpoint import (
        check_strategy,
        intact_checkpoints,
        is_adapter_checkpoint,
        no_intact_checkpoint,
    )
    from bridges.grpo.server_rollouts import check_server_settings
    from bridges.models.hardware import check_device
    from bridges.runs.preflight import check_lora_targets, check_model
    from bridges.runtime.errors import ConfigError, require_extra
    from bridges.runtime.launch import accelerate_settings, launched_size

    t = config.trainer
    check_model(config.model)
    check_device(t.device, "trainer.device")
    check_server_settings(t)
    if accelerate_settings().get("deepspeed"):
        raise ConfigError(
            "backend=grpo does not run DeepSpeed; under accelerate launch use examples/accelerate/fsdp.yaml "
            "(FSDP2 shards what ZeRO-3 shards), or backend=trl, which runs accelerate's DeepSpeed configs."
        )
    _check_engine_settings(config)
    if config.resume:
        ckpt_dir = Path(config.output_dir) / config.resolved_run_name / "checkpoints"
        intact, damaged = intact_checkpoints(ckpt_dir)
        if damaged and not intact:
            raise no_intact_checkpoint(ckpt_dir, damaged)
        if intact and is_adapter_checkpoint(intact[0]) != (t.lora_rank > 0):
            kind = "a LoRA adapter" if is_adapter_checkpoint(intact[0]) else "full weights"
            raise ConfigError(
                f"resume=true but {intact[0].name} holds {kind} and trainer.lora_rank={t.lora_rank}; "
                "resume with the lora_rank the run was started with."
            )
        if intact:
            processes = max(t.num_processes, launched_size())
            check_strategy(intact[0], None, sharded=hardware_settings(config)[1] == "fsdp" and processes > 1)
    if t.lora_rank > 0:
        require_extra("peft", "trl", "LoRA training (trainer.lora_rank > 0)")
        check_lora_targets(config.model, t.lora_target_modules)


def _check_engine_settings(config: TrainConfig) -> None:
    """The engine, where it runs and what it runs beside, agree with each other, or one sentence."""
    from bridges.runtime.errors import ConfigError, require_extra
    from bridges.runtime.launch import launched_size

    t = config.trainer
    if config.vllm.get("enable_sleep_mode") and (config.engine != "vllm" or batches_ahead(config) != 0
                                                 or t.inference != "engine"):
        raise ConfigError(
            "vllm.enable_sleep_mode=true offloads the vLLM engine while the trainer steps, so it needs "
            "engine=vllm, trainer.inference=engine and trainer.num_batches_ahead=0 (nothing generating during a step)."
        )
    if config.engine == "vllm" and t.inference == "engine":
        require_extra("vllm", "vllm", "engine=vllm")
    if t.rollout_process and (
        config.engine in ("vllm", "paged") or (config.engine == "auto" and torch.cuda.is_available())
    ):
        raise ConfigError(
            "trainer.rollout_process=true runs the hf engine in a child process; set engine=hf."
        )
    if config.engine == "vllm" and max(t.num_processes, launched_size()) > 1:
        raise ConfigError(
            "engine=vllm runs in one training process only (an engine per process on its own GPU is not "
            "built yet); with several processes use engine=hf or engine=auto."
        )
    if t.rollout_process and t.num_processes > 1:
        raise ConfigError(
            "trainer.rollout_process=true and trainer.num_processes>1 do not combine: each training process "
            "already rolls out beside the others; drop trainer.rollout_process."
        )


# --------------------------------------------------------------------------------------------------
# One optimizer step on this process's samples of one batch (in a worker thread, off the event loop)


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
    master: MasterWeights
    scaler: DynamicLossScale  # dynamic loss scaling for fp16, a no-op otherwise
    device: torch.device
    logprob_chunk_tokens: int = 256
    chunked_logprobs: bool = True
    micro_batch_tokens: int = (
        0  # > 0: packed micro-batches of at most this many tokens (batching.pack_micro_batches)
    )
    world: World = dataclasses.field(default_factory=World)


def train_step(ctx: StepContext, samples: list[TrainingSample]) -> dict[str, float]:
    """Accumulate the policy loss over micro-batches, clip, step. The loss is the mean per-sample loss
    over the step's samples on every process together. No samples anywhere -> no update."""
    world = ctx.world
    total, total_tokens = (int(n) for n in reduce_sum(
        [len(samples), sum(sum(s.loss_mask[1:]) for s in samples)], world, ctx.device))  # [distributed] global
    if total == 0:
        return {"loss": 0.0, "grad_norm": 0.0, "clip_fraction": 0.0, "ratio/mean": 1.0, "kl": 0.0,
                "skipped_nonfinite": 0.0, "skipped_overflow": 0.0, "optimizer/stepped": 0.0, "tokens/trained": 0.0}
    ctx.policy.train()
    if ctx.micro_batch_tokens:
        chunks = pack_micro_batches(samples, ctx.micro_batch_tokens)
    else:
        chunks = [c for c in (samples[i :: ctx.grad_accum_steps] for i in range(ctx.grad_accum_steps)) if c]
    # [distributed] every process runs as many micro-batches as the busiest (each pass is a collective)
    chunks += [[] for _ in range(int(reduce_max(len(chunks), world, ctx.device)) - len(chunks))]
    # the step's loss: the mean over its samples, or over its loss tokens (trainer.loss_aggregation=token)
    denominator = total_tokens if ctx.loss_config.token_mean else total
    weight = loss_weight(world, max(denominator, 1))
    sums = [0.0] * 6  # loss, loss tokens, clipped tokens, ratio sum, kl sum, tokens through the model
    for chunk in chunks:
        out = _micro_batch_loss(ctx, chunk or [padding_sample(ctx.pad_token_id)])
        ctx.scaler.scale(out.per_sample_B.sum() * (weight if chunk else 0.0)).backward()
        if chunk:
            parts = (float(out.per_sample_B.detach().sum()) / max(denominator, 1), out.tokens, out.clipped_tokens,
                     out.ratio_sum, out.kl_sum, sum(len(s.token_ids) for s in chunk))
            sums = [a + b for a, b in zip(sums, parts, strict=True)]
    ctx.master.grads_to_master()  # what autograd's hooks did not already move (fp32 sums, see precision.py)
    sum_gradients(ctx.master.params, world)  # [distributed] ddp: one fp32 all-reduce of the gradients
    ctx.scaler.unscale_(ctx.master.params)
    grad_norm = grad_norm_value(torch.nn.utils.clip_grad_norm_(ctx.master.params, ctx.max_grad_norm))
    loss, tokens, clipped, ratio_sum, kl_sum, trained = reduce_sum(
        sums, world, ctx.device
    )  # [distributed] metrics
    # One non-finite step would turn every weight into NaN for good: skip it (the loop stops the run
    # after MAX_NONFINITE_STEPS in a row, which means something upstream is broken). In fp16 an
    # overflowing gradient is the loss scale's to handle: the scaler halves it, the step is skipped.
    overflow = ctx.scaler.enabled and math.isfinite(loss) and not math.isfinite(grad_norm)
    skipped = not (math.isfinite(loss) and math.isfinite(grad_norm))
    if not skipped:
        ctx.optimizer.step()
        ctx.master.master_to_model()
        ctx.scheduler.step()
    ctx.scaler.update(overflow=not math.isfinite(grad_norm))  # the global norm: every process agrees
    ctx.optimizer.zero_grad(set_to_none=True)
    ctx.policy.zero_grad(set_to_none=True)
    ctx.policy.eval()
    shown = max(tokens, 1.0)
    return {"loss": loss, "grad_norm": grad_norm, "clip_fraction": clipped / shown, "ratio/mean": ratio_sum / shown,
            "kl": kl_sum / shown, "skipped_nonfinite": float(skipped and not overflow),
            "skipped_overflow": float(overflow), "optimizer/stepped": float(not skipped),
            "tokens/trained": trained}


def _micro_batch_loss(ctx: StepContext, chunk: list[TrainingSample]) -> LossOutput:
    """The policy loss of one micro-batch: logprobs at its loss positions (fp32, chunked over the
    vocabulary), the reference model's where a KL term needs them."""
    batch = collate(chunk, ctx.pad_token_id, ctx.device)
    logprobs = functools.partial(sequence_logprobs, input_ids_B_L=batch.input_ids_B_L,
                                 attention_mask_B_L=batch.attention_mask_B_L, temperature=ctx.temperature,
                                 wanted_B_T=batch.loss_mask_B_T, chunk_tokens=ctx.logprob_chunk_tokens,
                                 chunked=ctx.chunked_logprobs, packed=ctx.micro_batch_tokens > 0)
    ref_logps_B_T = None
    if ctx.reference is not None:
        with torch.no_grad():
            ref_logps_B_T = logprobs(ctx.reference)
    return policy_loss(logprobs(ctx.policy, fp32_grad=ctx.master.fp32_grad), batch.sampler_logps_B_T, batch.advantages_B, batch.loss_mask_B_T,
                       ctx.loss_config, ref_logps_B_T)


# --------------------------------------------------------------------------------------------------
# The run: setup here, the loop itself is workflows.run_loop (shared with the Tinker backend)


def run(config: TrainConfig, options: None = None) -> int:
    """The ``Backend`` entry point: join the other processes, then prepare (``_prepare`` -> ``_Prepared``) and
    train (``_train``, the loop in ``workflows.run_loop``, which names its own ``RunSpec`` and ``RunPosition``)."""
    dtype, strategy = hardware_settings(config)
    where, world = placement(config.trainer.device, dtype), world_from_env(strategy)
    start_processes(world, where.device)  # [distributed] join the process group
    watch = PeerWatch.start(world, config.trainer.peer_timeout_s)  # [distributed] the others' heartbeats
    with watched(watch):  # [distributed] a peer that stops ends the run in one sentence naming it
        return asyncio.run(_train(config, where, world, watch))


@dataclasses.dataclass
class _Prepared:
    """Everything one run holds: the config, the data, the policy and its optimizer, where it writes."""

    config: TrainConfig
    env: Any
    dataset: Any
    tokenizer: Any
    ctx: StepContext
    start: RunPosition
    run_dir: Path
    sampling_args: dict[str, Any]
    where: Placement
    watch: PeerWatch | None


def _prepare(config: TrainConfig, where: Placement, world: World, watch: PeerWatch | None) -> _Prepared:
    """Seeds, environment, the step context, resumed from the newest intact checkpoint."""
    from bridges.envs.registry import load_environment

    t = config.trainer
    run_dir = Path(config.output_dir) / config.resolved_run_name
    check_shared_run_folder(run_dir, world)  # [distributed]
    random.seed(config.seed)
    torch.manual_seed(config.seed)
    if where.device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        # Generation and training run in two threads at once; one intra-op thread each keeps them
        # from oversubscribing a small CPU (measured 10-20x slower with the default under load).
        torch.set_num_threads(1)
    env = load_environment(config.env, **config.env_args)
    env.max_concurrent = t.max_concurrent
    ctx, tokenizer = build_step_context(config, where, world)
    start = _resume(config, run_dir, ctx)
    check_agreement("the step the run resumes from", (start.step, start.data_position), world)  # [distributed]
    sampling_args = rollout_sampling_args(config, env.sampling_args)
    return _Prepared(config, env, env.get_dataset(), tokenizer, ctx, start, run_dir, sampling_args, where, watch)


def hardware_settings(config: TrainConfig) -> tuple[str, str]:
    """``trainer.dtype`` and ``trainer.strategy``, or, left at their defaults under ``accelerate launch``,
    what its config file says (``examples/accelerate/``)."""
    from bridges.runtime.launch import accelerate_settings

    t, launcher = config.trainer, accelerate_settings()
    dtype = launcher.get("dtype", t.dtype) if t.dtype == "auto" else t.dtype
    strategy = launcher.get("strategy", t.strategy) if t.strategy == "ddp" else t.strategy
    return dtype, strategy


def build_step_context(config: TrainConfig, where: Placement, world: World) -> tuple[StepContext, Any]:
    """The policy on its device in its precision (sharded under fsdp), its fp32 masters, AdamW, the
    schedule and the loss settings; and the tokenizer."""
    t = config.trainer
    # [distributed] fsdp keeps fp32 sharded parameters (their own masters) and computes in where.dtype
    policy, tokenizer = load_policy(config, where, weights_dtype=torch.float32 if world.sharded else None)
    chunked = chunked_matches_plain(policy, len(tokenizer))
    if not chunked and world.is_main:
        print(
            "note: this model's forward does more to its logits than a linear head (a soft cap, a scale), "
            "so logprobs are computed from its full logits, which needs more memory per batch."
        )
    if t.micro_batch_tokens and not varlen_attention(policy) and world.is_main:
        attention = cast(Any, policy).config._attn_implementation
        print(
            f"note: trainer.micro_batch_tokens packs each micro-batch into rows as long as its longest sequence: "
            f"attention '{attention}' has no varlen kernel, so one packed row of "
            f"{t.micro_batch_tokens} tokens would cost its square (flash-attn on CUDA packs one row)."
        )
    policy = shard(policy, world, where.dtype)  # [distributed] fsdp: parameters sharded across processes
    master = MasterWeights(policy)
    optimizer = make_optimizer(master.params, config.resolved_learning_rate, t.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / t.warmup_steps) if t.warmup_steps > 0 else 1.0
    )
    loss_config = LossConfig(loss_type=advantage_method(t.loss), epsilon=t.epsilon, epsilon_high=t.epsilon_high,
                             ratio_cap=t.ratio_cap, beta=t.beta, max_completion_length=t.max_completion_length,
                             aggregation=t.loss_aggregation)
    ctx = StepContext(
        policy=policy,
        reference=load_policy(config, where)[0].eval().requires_grad_(False) if t.beta != 0.0 else None,
        optimizer=optimizer, scheduler=scheduler, loss_config=loss_config,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
        temperature=config.sampling.temperature, grad_accum_steps=t.grad_accum_steps, max_grad_norm=t.max_grad_norm,
        master=master, scaler=make_scaler(where.dtype, where.device), device=where.device,
        logprob_chunk_tokens=t.logprob_chunk_tokens or default_chunk_tokens(where.device), chunked_logprobs=chunked,
        world=world,
        micro_batch_tokens=t.micro_batch_tokens,
    )
    return ctx, tokenizer


def _resume(config: TrainConfig, run_dir: Path, ctx: StepContext) -> RunPosition:
    """``resume=true`` (set for every worker of a job torchrun may restart: ``bridges.jobs.train``): weights,
    masters, optimizer, scheduler and position from the newest intact checkpoint (every process reads the same
    one); the start of the run otherwise. The run's files are cut back to that step, so no step counts twice."""
    if not config.resume:
        return RunPosition()
    resumed = resume_latest_intact(run_dir / "checkpoints", ctx.policy, ctx.optimizer, ctx.scheduler,
                                   ctx.master, ctx.world, ctx.scaler)
    say = print if ctx.world.is_main else (lambda *_: None)
    if resumed is None:
        say(f"resume=true but {run_dir / 'checkpoints'} has no checkpoint; starting from step 0.")
        return RunPosition()
    start, resume_from = resumed
    say(f"resumed from {resume_from} (step {start.step}, data position {start.data_position})")
    return start


async def _rollouts(run: _Prepared) -> Rollouts:
    """In this process, or (``rollout_process=true``; validate() allowed it only with the hf engine) in a
    child process that owns its own copy of the weights, or on inference servers (``inference=server``)."""
    config = run.config
    if config.trainer.inference == "server":
        from bridges.grpo.server_rollouts import open_server_rollouts

        return await open_server_rollouts(
            config, run.env, run.tokenizer, run.ctx.policy, run.ctx.world, run.run_dir, run.start.step
        )
    if config.trainer.rollout_process:
        from bridges.grpo.rollout_process import ProcessRollouts

        return ProcessRollouts(config, run.where)
    processes = run.ctx.world.size
    shape = batch_shape(config, run.env, run.tokenizer, processes)
    # what the step will still allocate (gradients, AdamW's moments, activations): engines leave it free
    reserve = step_reserve_bytes(run.ctx, config, run.where.dtype, shape.tokens_per_row, processes)
    engine = make_engine(config, run.where, run.tokenizer, shape, processes, reserve)
    sleeps = bool(config.vllm.get("enable_sleep_mode"))  # validate(): only with engine=vllm, nothing ahead
    return InProcessRollouts(engine, run.env, config.trainer.group_size, config.model,
                             advantage_method(config.trainer.loss), offload=engine.asleep if sleeps else None)


@dataclasses.dataclass
class _Learner:
    """The loop's view of this trainer: rollouts from ``Rollouts`` (this process's share of each batch),
    a step from ``train_step`` (in a worker thread, so the next batch keeps generating), checkpoints in
    ``<run>/checkpoints``."""

    run: _Prepared
    rollouts: Rollouts
    started: list[asyncio.Future[list[Group]]] = dataclasses.field(default_factory=list)
    steps: int = 0  # train() calls in this process: the step is run.start.step + steps

    @property
    def step(self) -> int:
        return self.run.start.step + self.steps

    def report(self, doing: str) -> None:
        if self.run.watch is not None:  # [distributed] what the other processes quote if this one stops
            self.run.watch.report(doing)

    @property
    def weight_version(self) -> int:
        return self.rollouts.weight_version

    def start_batch(
        self, rows: list[dict[str, Any]], sampling_args: dict[str, Any]
    ) -> asyncio.Future[list[Group]]:
        world = self.run.ctx.world
        batch = self.rollouts.start(rows[world.rank :: world.size], sampling_args)  # [distributed] whole groups
        self.started = [*(f for f in self.started if not f.done()), batch]
        return batch

    async def push_weights(self) -> None:
        """The policy's trained tensors to the engine (whole tensors: gathered under fsdp)."""
        policy = self.run.ctx.policy
        state = await asyncio.to_thread(
            bound(self.run.where.device, full_state_dict), policy, trainable_names(policy)
        )
        await self.rollouts.update_weights(state, policy)

    async def train(self, samples: list[TrainingSample]) -> dict[str, Any]:
        self.steps += 1
        self.report(f"training step {self.step}")
        # vllm.enable_sleep_mode: the engine's memory is the step's (its weights discarded: pushed back below)
        offloaded = await self.rollouts.offload()
        result: dict[str, Any] = await asyncio.to_thread(
            bound(self.run.where.device, train_step), self.run.ctx, samples
        )
        if result.get("optimizer/stepped") or offloaded:
            # the batches already started finish on the weights they started with, so which weights sample
            # which batch is fixed by the step, never by how fast a thread ran (the same seed, the same run)
            if in_flight := [f for f in self.started if not f.done()]:
                await asyncio.wait(in_flight)
            self.report(f"sending the weights of step {self.step} to the engine")
            await self.push_weights()
        self.report(f"generating the rollouts of step {self.step + 1}")
        return {
            **result,
            "lr": self.run.ctx.scheduler.get_last_lr()[0],
            **memory_metrics(self.run.where.device),
        }

    async def save(self, position: RunPosition) -> None:
        run, ctx = self.run, self.run.ctx
        self.report(f"saving the checkpoint of step {position.step}")
        await asyncio.to_thread(
            bound(run.where.device, save_checkpoint), run.run_dir / "checkpoints", position, ctx.policy, ctx.optimizer, ctx.scheduler,
            ctx.master, ctx.world, keep=run.config.keep_checkpoints, tokenizer=run.tokenizer, scaler=ctx.scaler,
        )


async def _train(config: TrainConfig, where: Placement, world: World, watch: PeerWatch | None) -> int:
    run = _prepare(config, where, world, watch)
    rollouts = await _rollouts(run)
    learner = _Learner(run, rollouts)
    spec = RunSpec(run.run_dir, "grpo", rollouts.name, config.model, run.dataset, run.sampling_args,
                   ["metrics.jsonl", "traces.jsonl.gz", "checkpoints/"], reducer=_reducer(run.ctx),
                   rows_together=run.env.rows_together, eval_dataset=eval_rows(config, run.env),
                   reward_names=tuple(run.env.rubric.get_reward_func_names()))
    finished = False
    try:
        await (
            learner.push_weights()
        )  # the engine samples the policy (a resumed one too) from the first rollout
        await run_training(config, spec, learner, run.start)
        finished = True
    finally:
        await rollouts.aclose()
        stop_processes(finished)
    return 0


def _reducer(ctx: StepContext) -> Any:
    """The loop's view of the processes: which one reports, and how step tallies add up."""
    from bridges.workflows.run_loop import Reducer

    return Reducer(is_main=ctx.world.is_main, combine=functools.partial(combine_tallies, world=ctx.world),
                   barrier=bound(ctx.device, functools.partial(barrier, ctx.world)))


# the bundled trainer reads every shared key and has no section of its own
BACKEND = Backend(name="grpo", run=run, honoured_keys=shared_keys(), validate=validate)
