"""``python -m bridges.train backend=trl``: the shared configuration, trained by TRL's ``GRPOTrainer``.

The shared keys map onto ``GRPOConfig`` once, here; every other ``GRPOConfig`` field passes
through untouched from the ``trl.*`` section (``trl.scale_rewards=none``, ``trl.use_vllm=true``
...), and wins over the mapping. The learning-rate schedule is constant after warmup, like
``bridges.grpo``'s, so the two backends compare at equal settings.

The run writes what every backend writes: ``runs/<run_name>/metrics.jsonl`` (one line per step with
``step`` and ``reward/mean``, plus TRL's own log keys) and ``reward_curve.png``; TRL's checkpoints
go to ``runs/<run_name>/checkpoint-<step>`` and ``resume=true`` continues from the latest.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from bridges.adapters.trl.metrics_file import RowOf, metrics_callback
from bridges.runs.backends import Backend
from bridges.runs.config import check_passthrough
from bridges.runs.metrics import renamed
from bridges.runs.train_config import (
    TrainConfig,
    check_one_sequence_a_rollout,
    check_synchronous,
    completion_budget,
    lora_config,
    shared_keys,
    turn_max_tokens,
)
from bridges.runtime.errors import ConfigError, require_extra
from bridges.runtime.launch import launched_size
from bridges.workflows.run_loop import eval_due, held_out_rows

# GRPOTrainer's log keys under the names every backend uses (its own other keys pass through)
TRL_METRIC_NAMES = {
    "reward": "reward/mean", "reward_std": "reward/std", "learning_rate": "lr",
    "completions/mean_length": "tokens/completion_mean", "env/errored_fraction": "episodes/masked_fraction",
    "frac_reward_zero_std": "groups/zero_variance_fraction", "step_time": "timing/trl_step_s",
}
TRL_EVAL_METRICS = ("reward", "reward_std", "completions/mean_length", "env/errored_fraction")  # as eval/<shared>


# TRL runs its own generation and step: no pipelining, no rollout process; its rollout_func runs each
# batch's groups with the environment's own concurrency. Several processes are accelerate's data
# parallelism (FSDP and DeepSpeed through TRL's own accelerate config); the logprob computation is TRL's.
# The ratio cap is TRL's ``delta`` (two-sided truncation of the ratio, as the bundled trainer's).
HONOURED_KEYS = shared_keys() - {
    "trainer.max_concurrent", "trainer.rollout_process",
    "trainer.strategy", "trainer.logprob_chunk_tokens",
    "trainer.micro_batch_tokens",  # TRL packs with its own trl.padding_free (flash-attention only)
    "trainer.kernels",  # TRL's own: trl.use_liger_kernel, or torch_compile in its TrainingArguments
    "trainer.peer_timeout_s",  # accelerate's processes: torchrun and NCCL's own timeouts
}


def parse_options(section: dict[str, Any]) -> dict[str, Any]:
    """The ``trl.*`` section checked against ``GRPOConfig``'s own fields and their types."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    require_extra("trl", "trl", "backend=trl")
    from trl import GRPOConfig

    check_passthrough(section, {f.name: f.type for f in dataclasses.fields(GRPOConfig)}, "trl.", "GRPOConfig")
    return section


def grpo_config_kwargs(config: TrainConfig, env: Any, run_dir: Path) -> dict[str, Any]:
    """Shared keys -> ``GRPOConfig`` fields, then the ``trl.*`` pass-through on top."""
    from bridges.models.hardware import placement

    t = config.trainer
    processes = max(t.num_processes, launched_size())
    where = placement(t.device, t.dtype)
    cpu = where.device.type == "cpu"
    kwargs: dict[str, Any] = {
        "output_dir": str(run_dir),
        "max_steps": t.max_steps,
        # TRL generates per_device x processes x grad_accum sequences per optimizer step: the step's
        # batch_size x group_size rollouts are split over both, as the bundled trainer splits them
        "per_device_train_batch_size": t.batch_size * t.group_size // (processes * t.grad_accum_steps),
        "num_generations": t.group_size,
        "gradient_accumulation_steps": t.grad_accum_steps,
        "learning_rate": config.resolved_learning_rate,
        "lr_scheduler_type": "constant_with_warmup",
        "warmup_steps": t.warmup_steps,
        "weight_decay": t.weight_decay,
        "max_grad_norm": t.max_grad_norm,
        # trainer.loss_aggregation as TRL's own loss types: each sequence's mean (grpo) or the global token mean (dapo)
        "loss_type": t.loss if t.loss == "dr_grpo" else {"sample": "grpo", "token": "dapo"}[t.loss_aggregation],
        # dr_grpo's advantages are r - mean (no std division), as on grpo, Tinker and verl; TRL's default
        # "group" would still divide by the std, doubling them against the others on a 0/1 group of four
        "scale_rewards": "none" if t.loss == "dr_grpo" else "group",
        "epsilon": t.epsilon,
        "beta": t.beta,
        "max_completion_length": completion_budget(config, env),
        "temperature": config.sampling.temperature,
        "top_p": config.sampling.top_p,
        "seed": config.seed,
        "use_cpu": cpu,
        # the Trainer's mixed precision: fp32 weights and optimizer, the forward under autocast
        "bf16": str(where.dtype) == "torch.bfloat16",
        "fp16": str(where.dtype) == "torch.float16",
        "gradient_checkpointing": t.gradient_checkpointing == "full",  # every layer or none: check_recompute
        "ddp_find_unused_parameters": False,  # every parameter takes part in the forward (LoRA: peft's own)
        "report_to": "none" if config.report_to == "none" else [config.report_to],
        "logging_steps": 1,
        "save_strategy": "steps" if config.save_every > 0 else "no",
        "save_steps": max(1, config.save_every),
        "save_total_limit": config.keep_checkpoints,
        "disable_tqdm": not config.progress,
        # eval_every: TRL's own evaluation on the eval split, every eval_steps steps (eval_dataset: run())
        "eval_strategy": "steps" if config.eval_every > 0 else "no",
        "eval_steps": max(1, config.eval_every),
        "per_device_eval_batch_size": t.batch_size * t.group_size // (processes * t.grad_accum_steps),
    }
    if t.epsilon_high is not None:
        kwargs["epsilon_high"] = t.epsilon_high
    if t.ratio_cap is not None:
        kwargs["delta"] = t.ratio_cap
    return {**kwargs, **generation_settings(config, where), **config.trl}


def generation_settings(config: TrainConfig, where: Any) -> dict[str, Any]:
    """Which engine TRL generates with, from ``engine=``: vLLM (``use_vllm``, colocated, or on TRL's
    server when ``trl.vllm_server_base_url`` is given, as TRL documents) for ``vllm``, and for ``auto``
    on a GPU where vLLM is installed; TRL's own transformers generation otherwise."""
    import importlib.util

    wants = config.engine == "vllm" or (
        config.engine == "auto" and where.device.type == "cuda" and importlib.util.find_spec("vllm") is not None
    )
    if not wants:
        return {}
    return {"use_vllm": True, "vllm_mode": "server" if config.trl.get("vllm_server_base_url") else "colocate"}


def build_grpo_config(kwargs: dict[str, Any]) -> Any:
    """``GRPOConfig(**kwargs)`` (keys checked by ``parse_options``), its own refusals in one sentence."""
    from trl import GRPOConfig

    try:
        return GRPOConfig(**kwargs)
    except ValueError as exc:
        raise ConfigError(f"GRPOConfig refused these settings: {' '.join(str(exc).split())}") from exc


def describe(config: TrainConfig, options: dict[str, Any]) -> str:
    """For ``dry_run=true``: the ``GRPOConfig`` fields this run would use, one per line."""
    from bridges.envs.registry import load_environment

    env = load_environment(config.env, **config.env_args)
    kwargs = grpo_config_kwargs(config, env, Path(config.output_dir) / config.resolved_run_name)
    return "# GRPOConfig\n" + "".join(f"{key}: {value!r}\n" for key, value in kwargs.items())


def function_rewards(logs: dict[str, Any], weights: dict[str, float]) -> dict[str, float]:
    """TRL's ``rewards/<function>/mean|std`` as the shared ``reward/<function>/mean|std``: each of our TRL
    reward functions returns its weight times the function's score (``rewards.trl_reward_funcs``), so the weight
    is divided out and every backend reports the function's own score."""
    row = {}
    for name, weight in weights.items():
        for moment in ("mean", "std"):
            value = logs.get(f"rewards/{name}/{moment}")
            if isinstance(value, int | float) and weight:
                row[f"reward/{name}/{moment}"] = value / (weight if moment == "mean" else abs(weight))
    return row


def grpo_metric_row(rollouts_per_step: int, eval_every: int = 0, max_steps: int = 0,
                    weights: dict[str, float] | None = None) -> RowOf:
    """A GRPO training log line (the ones with a reward) as a ``metrics.jsonl`` row in the names every
    backend shares, with ``episodes/total``, the rollouts of the step, which TRL does not log, and each
    rubric function's score (``weights``: the rubric's non-zero weights by function).

    TRL logs an evaluation as a line of its own right after its step's line; a step that evaluates
    (``eval_due``) is held until that line comes and written once with its ``eval/*`` keys, as the
    shared loop writes it."""
    held: dict[str, Any] = {}

    def row_of(step: int, logs: dict[str, Any]) -> dict[str, Any] | None:
        if "eval_reward" in logs:
            row = held.pop("row", None) or {"step": step}
            return {**row, **{f"eval/{TRL_METRIC_NAMES.get(k[5:], k[5:])}": v for k, v in logs.items()
                              if k.startswith("eval_") and k[5:] in TRL_EVAL_METRICS}}
        if "reward" not in logs:
            return None
        row = renamed({"step": step, "episodes/total": rollouts_per_step, **logs}, TRL_METRIC_NAMES)
        row.update(function_rewards(logs, weights or {}))
        if eval_due(eval_every, step, max_steps):
            held["row"] = row
            return None
        return row

    return row_of


def eval_examples(kwargs: dict[str, Any], config: TrainConfig) -> dict[str, Any]:
    """The trainer's keyword arguments with the eval split as ``eval_every``/``eval_examples`` ask: its
    first ``eval_examples`` rows, or none at all when the run does not evaluate."""
    if config.eval_every == 0:
        kwargs.pop("eval_dataset", None)
    elif "eval_dataset" in kwargs:
        kwargs["eval_dataset"] = held_out_rows(kwargs["eval_dataset"], config.eval_examples)
    return kwargs


def quiet_console(trainer: Any) -> None:
    """Drop the transformers callbacks that print every log dict to the console (``ProgressCallback``
    writes it under its bar, ``PrinterCallback`` prints it): the step view is ``StepProgress``'s."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(ProgressCallback)
    trainer.remove_callback(PrinterCallback)


def check_recompute(config: TrainConfig) -> None:
    """TRL recomputes every decoder layer or none: around each generation it turns checkpointing off
    and then on again for every layer, so a stride (``every:K``) would silently become ``full``."""
    if config.trainer.gradient_checkpointing not in ("off", "full"):
        raise ConfigError(
            f"backend=trl recomputes every decoder layer or none (TRL turns recomputation back on for every "
            f"layer after each generation), so trainer.gradient_checkpointing={config.trainer.gradient_checkpointing} "
            "cannot hold; set it to full or off."
        )


def validate(config: TrainConfig, options: dict[str, Any]) -> None:
    """backend=trl's checks before the model loads: trl installed, the model, the engine, and every
    ``trl.*`` field through ``GRPOConfig`` itself (the same object the run builds)."""
    from bridges.adapters.trl import needs_rollout_func
    from bridges.adapters.trl.rollout import unsampled_settings
    from bridges.envs.registry import load_environment
    from bridges.models.hardware import check_device
    from bridges.runs.preflight import check_lora_targets, check_model

    check_model(config.model)
    check_device(config.trainer.device, "trainer.device")
    check_recompute(config)
    check_one_sequence_a_rollout(config)
    check_synchronous(config)
    if config.trainer.device.startswith("cuda:") and config.trainer.device != "cuda:0":
        raise ConfigError(
            f"backend=trl lets accelerate place the model, so trainer.device={config.trainer.device} cannot "
            "choose the GPU; set CUDA_VISIBLE_DEVICES instead, and trainer.device=auto."
        )
    if config.trainer.lora_rank > 0:
        check_lora_targets(config.model, config.trainer.lora_target_modules)
    check_generation(config)
    env = load_environment(config.env, **config.env_args)
    check_fsdp_generation(config, env)
    args = build_grpo_config(grpo_config_kwargs(config, env, Path(config.output_dir) / config.resolved_run_name))
    unsampled = unsampled_settings(args) if needs_rollout_func(env) else []
    if unsampled:
        raise ConfigError(f"backend=trl samples {config.env}'s turns through EngineClient, which has no "
                          f"{', '.join(unsampled)}; remove them (trl.* sampling applies to single-turn environments).")


def check_generation(config: TrainConfig) -> None:
    """The batch splits into TRL's micro-batches, and ``engine=vllm`` can run here, or one sentence."""
    import importlib.util

    t = config.trainer
    processes = max(t.num_processes, launched_size())
    if (t.batch_size * t.group_size) % (processes * t.grad_accum_steps):
        raise ConfigError(
            f"trainer.batch_size x trainer.group_size = {t.batch_size * t.group_size} rollouts per step do not split "
            f"into {processes} process(es) x trainer.grad_accum_steps={t.grad_accum_steps} equal micro-batches; "
            "change one of them."
        )
    remote = bool(config.trl.get("vllm_server_base_url"))
    if config.engine == "vllm" and not remote and importlib.util.find_spec("vllm") is None:
        raise ConfigError("engine=vllm with backend=trl runs vLLM in this process: pip install 'rl-bridges[vllm]', "
                          "or give trl.vllm_server_base_url of a running trl vllm-serve.")


def check_fsdp_generation(config: TrainConfig, env: Any) -> None:
    """Under accelerate's FSDP, a multi-turn environment generating through the trained model itself
    (no vLLM) would run unsharded forwards on sharded parameters, a different number on each process,
    so the all-gathers fall out of step: refused in one sentence (ZeRO-3 and DDP are fine)."""
    from bridges.adapters.trl import needs_rollout_func
    from bridges.models.hardware import placement
    from bridges.runtime.launch import accelerate_settings

    uses_vllm = {**generation_settings(config, placement(config.trainer.device, config.trainer.dtype)),
                 **config.trl}.get("use_vllm", False)
    if accelerate_settings().get("strategy") == "fsdp" and not uses_vllm and needs_rollout_func(env):
        raise ConfigError(
            f"backend=trl under accelerate's FSDP cannot run {config.env}'s turns on the model it trains (each "
            "process would gather shards a different number of times); use vLLM (engine=vllm), or a DDP or "
            "DeepSpeed ZeRO-3 accelerate config."
        )


def run(config: TrainConfig, options: dict[str, Any]) -> int:
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    require_extra("trl", "trl", "backend=trl")
    if config.report_to == "wandb":  # transformers' wandb callback reads these two, nothing else
        os.environ["WANDB_PROJECT"] = config.wandb.resolved_project()
        entity = config.wandb.resolved_entity()
        if entity:
            os.environ["WANDB_ENTITY"] = entity
    import torch
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    from bridges.adapters.trl import trl_trainer_kwargs
    from bridges.adapters.trl.checkpoints import resume_point
    from bridges.adapters.trl.rewards import rubric_weights
    from bridges.envs.registry import load_environment
    from bridges.models.hardware import load_causal_lm, placement
    from bridges.models.tiny import resolve_model_path
    from bridges.runs.metrics import MetricsLogger, StepProgress, finish_run
    from bridges.runtime.launch import is_main_process

    env = load_environment(config.env, **config.env_args)
    run_dir = Path(config.output_dir) / config.resolved_run_name
    args = build_grpo_config(grpo_config_kwargs(config, env, run_dir))
    path = resolve_model_path(config.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    t = config.trainer
    # the Trainer places the model and keeps its weights fp32 (mixed precision is its autocast)
    model = load_causal_lm(path, placement(t.device, t.dtype), weights_dtype=torch.float32)
    resume, step = resume_point(run_dir, config.resume)
    main = is_main_process()  # with several processes the first one alone writes the run's files
    logger = MetricsLogger(run_dir, dataclasses.asdict(config), "none", resume_step=step) if main else None
    progress = StepProgress(config.progress, t.max_steps, step, "trl", shown=main)
    trainer = GRPOTrainer(
        model=model,
        args=args,
        processing_class=tokenizer,
        peft_config=lora_config(t),
        callbacks=[metrics_callback(grpo_metric_row(t.batch_size * t.group_size, config.eval_every, t.max_steps,
                                                    rubric_weights(env)), logger, progress)],
        # sampling.max_tokens caps each model turn, as on every backend; max_completion_length the episode
        **eval_examples(trl_trainer_kwargs(env, t.group_size, turn_max_tokens(config)), config),
    )
    quiet_console(trainer)
    try:
        trainer.train(resume_from_checkpoint=resume)
    finally:
        progress.close()
        if logger is not None:
            logger.close()
    if logger is not None:
        finish_run(
            logger.rows, run_dir, f"{config.env} · {config.model} · trl", ["metrics.jsonl", "TRL checkpoints"]
        )
    return 0


def section_help() -> str:
    """``help=trl``: the section passes through to TRL's ``GRPOConfig``; its fields, when TRL is here."""
    lines = ["trl keys: any field of trl.GRPOConfig, as trl.<field>=value (checked against GRPOConfig itself);",
             "the shared keys (trainer.*, sampling.*) set the fields they name, and a trl.* key of the same",
             "field is refused.", ""]
    try:
        from trl import GRPOConfig
    except ImportError:
        return "\n".join([*lines, "TRL is not installed here: pip install 'rl-bridges[trl]'."]) + "\n"
    for f in dataclasses.fields(GRPOConfig):
        text = " ".join(str(f.metadata.get("help", "")).split())
        lines.append(f"  trl.{f.name}  {text[:100]}".rstrip())
    return "\n".join(lines) + "\n"


BACKEND = Backend(
    name="trl", run=run, honoured_keys=HONOURED_KEYS, parse_options=parse_options, validate=validate,
    describe=describe, section_help=section_help,
)
