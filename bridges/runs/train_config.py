"""The one configuration every ``python -m bridges.train backend=<name>`` run shares.

Shared keys (environment, model, group size, learning rate, sampling) are declared once, so the
same command line means the same experiment on every backend; each backend's native settings pass
straight through in their own open section (``trl.*`` as ``GRPOConfig`` fields, ``verl.*`` as hydra
overrides, ``tinker.*``) instead of being re-declared here.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from bridges.models.hardware import DEVICE_HELP, DTYPE_HELP, DTYPES
from bridges.runs.config import option

LOSS_TYPES = ("grpo", "dr_grpo")
STRATEGIES = ("ddp", "fsdp")
AGGREGATIONS = ("sample", "token")
LEDGER_BREAKS = ("auto", "every", "first")
TINY_LR, FULL_LR, LORA_LR = 1.5e-3, 1e-6, 1e-5  # learning-rate defaults (see TrainerConfig.learning_rate)
ENGINES = ("auto", "hf", "paged", "vllm")  # auto, or a name in bridges.runs.engines.ENGINES


@dataclass
class SamplingConfig:
    max_tokens: int | None = option(
        None, ge=1, help="tokens per model turn, on every backend; None: the environment's own sampling_args "
        "(a whole episode's budget is trainer.max_completion_length)"
    )
    temperature: float = option(
        1.0, gt=0.0, help="sampling temperature (> 0: training needs the sampler's logprobs)"
    )
    top_p: float = option(1.0, gt=0.0, le=1.0, help="nucleus sampling mass")


@dataclass
class WandbConfig:
    project: str | None = option(None, help="wandb project; None: $WANDB_PROJECT, else rl-bridges")
    entity: str | None = option(None, help="wandb entity (team or user); None: $WANDB_ENTITY, else your default")

    def resolved_project(self) -> str:
        import os

        return self.project or os.environ.get("WANDB_PROJECT") or "rl-bridges"

    def resolved_entity(self) -> str | None:
        import os

        return self.entity or os.environ.get("WANDB_ENTITY") or None


@dataclass
class TrainerConfig:
    # schedule
    max_steps: int = option(250, ge=1, help="optimizer steps")
    batch_size: int = option(16, ge=1, help="prompts (groups) per optimizer step")
    group_size: int = option(16, ge=2, help="rollouts per prompt (group-relative advantages need at least 2)")
    # optimisation
    learning_rate: float | None = option(
        None, gt=0.0, help=f"peak learning rate; None: {TINY_LR} for the built-in tiny models, {FULL_LR} for full "
        f"fine-tuning and {LORA_LR} for LoRA of any other model",
    )
    warmup_steps: int = option(0, ge=0, help="linear warmup steps")
    weight_decay: float = option(0.0, ge=0.0, help="AdamW weight decay")
    max_grad_norm: float = option(1.0, gt=0.0, help="gradient clipping norm")
    grad_accum_steps: int = option(1, ge=1, help="micro-batches per optimizer step")
    kernels: str = option(
        "eager", choices=("eager", "compile"), help="the training forward: eager, or compile (each decoder layer "
        "through torch.compile: fused norms, activations and rotary embedding; the first steps compile)",
    )
    micro_batch_tokens: int = option(
        0, ge=0, help="pack each micro-batch's sequences without padding, up to this many tokens (the "
        "micro-batches replace grad_accum_steps'): one row under varlen flash-attention, else rows as long as the "
        "longest sequence, whose block-diagonal mask costs no more than padding; 0: grad_accum_steps padded micro-batches",
    )
    # objective
    loss: str = option(
        "grpo",
        choices=LOSS_TYPES,
        help="grpo: (r - mean) / std; dr_grpo: r - mean, constant-length normaliser",
    )
    loss_aggregation: str = option(
        "sample", choices=AGGREGATIONS, help="how a step's loss averages its tokens, on every backend: sample (each "
        "sample's token mean, then the mean over samples) or token (one mean over every loss token of the step: "
        "longer episodes weigh more); trainer.loss=dr_grpo has its own (token sums over a constant length)",
    )
    epsilon: float = option(0.2, gt=0.0, help="PPO clip range (low side)")
    epsilon_high: float | None = option(None, gt=0.0, help="PPO clip range (high side); None: epsilon")
    ratio_cap: float | None = option(
        4.0, gt=1.0, help="truncation of the importance ratio against the sampler"
    )
    beta: float = option(0.0, ge=0.0, help="KL to a frozen reference model; 0 = no reference model")
    ledger_breaks: str = option(
        "auto", choices=LEDGER_BREAKS, help="an episode whose turns do not extend one another (an agent rewrote its "
        "history) is several token sequences: every (each a sample with the episode's advantage), first (the first "
        "only), auto (every on grpo and tinker; first on trl and verl, which take one sequence a rollout and refuse "
        "every); each counted in samples/breaks",
    )
    max_completion_length: int = option(512, ge=1, help="per-sample token budget after the prompt")
    # asynchrony: generation of step k+1 overlaps training on step k
    num_batches_ahead: int | None = option(
        None, ge=0, help="batches generated ahead of the one being trained on; null: the backend's own (1 on grpo "
        "and tinker; 0 on trl and verl, which generate with the weights they train and refuse more)",
    )
    max_concurrent: int = option(256, ge=1, help="rollouts in flight")
    rollout_process: bool = option(
        False, help="hf engine: roll out in a child process, so generation overlaps training"
    )
    # inference on bridges.serve servers the trainer pushes weights to (bridges.grpo.server_rollouts)
    inference: str = option(
        "engine", choices=("engine", "server"), help="engine: generation in each training process; server: on "
        "bridges.serve servers (server_urls, or servers=K started here), new weights pushed after every step",
    )
    server_urls: list[str] = option(
        factory=list, help="inference=server: running servers (http://host:port), started with weights_key; keys "
        "from $BRIDGES_SERVER_API_KEY and $BRIDGES_SERVER_WEIGHTS_KEY",
    )
    servers: int = option(
        0, ge=0, le=64, help="inference=server: start this many local bridges.serve hf servers"
    )
    server_devices: list[str] = option(
        factory=list, help="devices of the started servers, one per server (default: cpu each)"
    )
    server_timeout: float = option(600.0, gt=0.0, help="seconds a server may take to answer one model call")
    weight_channel: str = option(
        "auto", choices=("auto", "http", "gloo", "nccl"), help="how pushes reach the servers: http bodies, or "
        "broadcasts over a process group per server (nccl GPU to GPU, gloo on the CPU); auto: nccl where the "
        "trainer is on CUDA and every server offers it, else http",
    )
    # hardware: bridges.models.hardware resolves device and dtype; several processes split each step's groups
    device: str = option("auto", help=DEVICE_HELP)
    dtype: str = option("auto", choices=DTYPES, help=DTYPE_HELP)
    gradient_checkpointing: str = option(
        "off", help="recompute activations in the backward pass, less memory for more time: off, full (every "
        "decoder layer) or every:K (every K-th layer); true/false mean full/off (benchmarks/recompute.py)",
    )
    cuda_graphs: bool | None = option(
        None, help="engines on CUDA (hf, paged): decode steps replayed as CUDA graphs; null: on (hf: fixed "
        "shapes in row buckets, adapters/hf/static_decode.py); no effect on a CPU",
    )
    logprob_chunk_tokens: int = option(
        0,
        ge=0,
        help="loss positions whose vocabulary logits exist at once in the logprob step (chunk x vocab x 4 B); "
        "0: 1024 on CUDA, 256 on a CPU",
    )
    num_processes: int = option(
        1, ge=1, help="training processes (one per GPU); >1 starts them, each rolling out and training its share "
        "of every step's groups",
    )
    strategy: str = option(
        "ddp", choices=STRATEGIES, help="with several processes: ddp (replicas, gradients all-reduced) or fsdp "
        "(FSDP2: parameters, gradients and optimizer state sharded, like ZeRO-3)",
    )
    peer_timeout_s: float = option(
        60.0, gt=0.0, le=86400.0, help="with several processes: one silent this long (stopped, hung, its machine "
        "gone) ends the run with one sentence naming it; each beats once a second from a thread of its own",
    )
    # parameter-efficient training
    lora_rank: int = option(0, ge=0, help="LoRA rank; 0 = full fine-tuning")
    lora_alpha: int = option(32, ge=1, help="LoRA alpha")
    lora_dropout: float = option(0.0, ge=0.0, le=0.99, help="LoRA dropout")
    lora_target_modules: list[str] = option(
        factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"], help="modules LoRA adapts"
    )

    def __post_init__(self) -> None:
        # one spelling per choice from here on (true -> full), so every backend reads the same value;
        # a bad one fails here, at parse time, in one sentence
        from bridges.models.recompute import describe, recompute_stride

        self.gradient_checkpointing = describe(recompute_stride(self.gradient_checkpointing))
        if self.loss == "dr_grpo" and self.loss_aggregation != "sample":
            from bridges.runtime.errors import ConfigError

            raise ConfigError(
                f"trainer.loss_aggregation={self.loss_aggregation} has no place with trainer.loss=dr_grpo, which "
                "sums each sample's tokens over a constant length; pass one of them."
            )


def learning_rate(t: TrainerConfig, model: str, *, lora: bool) -> float:
    """``trainer.learning_rate``, or the default for ``model``: the embedded tiny models learn the default
    task fast at 1.5e-3, which would wreck a real checkpoint within a few steps."""
    from bridges.models.tiny import is_builtin_model

    if t.learning_rate is not None:
        return float(t.learning_rate)
    if is_builtin_model(model):
        return TINY_LR
    return LORA_LR if lora else FULL_LR


def completion_budget(config: TrainConfig, env: Any) -> int:
    """Tokens a whole episode may sample, for trainers that size their buffers by it (TRL's
    ``max_completion_length``, verl's ``max_response_length``). A single-turn episode is one turn, so its
    cap is the turn's (``sampling.max_tokens``, else the environment's); any other episode's is
    ``trainer.max_completion_length``, never ``sampling.max_tokens``, which caps each model turn on every
    backend (``turn_max_tokens``)."""
    from bridges.envs.singleturn import SingleTurnEnv

    if not isinstance(env, SingleTurnEnv):
        return int(config.trainer.max_completion_length)
    turn_cap = config.sampling.max_tokens
    if turn_cap is None:
        turn_cap = (env.sampling_args or {}).get("max_tokens")
    return int(turn_cap if turn_cap is not None else config.trainer.max_completion_length)


def batches_ahead(config: TrainConfig) -> int:
    """The pipeline depth of the backends that generate ahead (grpo, Tinker): ``trainer.num_batches_ahead``,
    1 when unset (generation of step k+1 overlapping training on step k). TRL and verl never read it:
    they generate with the weights that train, and refuse more than 0 (``check_synchronous``)."""
    ahead = config.trainer.num_batches_ahead
    return ahead if ahead is not None else 1


def check_synchronous(config: TrainConfig) -> None:
    """TRL and verl generate each batch with the weights that train on it: a batch ahead is refused, not
    ignored (0 is what they do, so it is accepted, and a comparison can set it on every backend)."""
    from bridges.runtime.errors import ConfigError

    if config.trainer.num_batches_ahead:
        raise ConfigError(
            f"backend={config.backend} generates each batch with the weights that train on it, so "
            f"trainer.num_batches_ahead={config.trainer.num_batches_ahead} cannot run there; remove it, or set 0 "
            "(and set 0 on every backend to compare them synchronously)."
        )


def check_one_sequence_a_rollout(config: TrainConfig) -> None:
    """TRL's ``rollout_func`` and verl's agent loop return one sequence a rollout, so the segments after a
    broken ledger's first cannot train there: ``trainer.ledger_breaks=every`` is refused, not ignored."""
    from bridges.runtime.errors import ConfigError

    if config.trainer.ledger_breaks == "every":
        raise ConfigError(
            f"backend={config.backend} trains one token sequence a rollout, so trainer.ledger_breaks=every (each "
            "segment of a broken ledger a sample) cannot run there; use first (what auto does there), or "
            "backend=grpo or tinker."
        )


def turn_max_tokens(config: TrainConfig) -> dict[str, int]:
    """The per-turn cap a backend that runs the environment's turns itself must pass on (TRL's
    ``rollout_func``, verl's agent loop): ``{"max_tokens": n}``, or nothing to keep the environment's."""
    return {} if config.sampling.max_tokens is None else {"max_tokens": int(config.sampling.max_tokens)}


def rollout_sampling_args(config: TrainConfig, env_defaults: dict[str, Any] | None) -> dict[str, Any]:
    """The sampling arguments of training rollouts: the environment's defaults, then the shared keys."""
    args: dict[str, Any] = {**(env_defaults or {}), **turn_max_tokens(config)}
    args.update(temperature=config.sampling.temperature, top_p=config.sampling.top_p)
    return args


def shared_keys() -> frozenset[str]:
    """Every ``trainer.*`` and ``sampling.*`` key: what a backend declares it honours (``SHARED_KEYS``)."""
    return frozenset(
        [f"trainer.{f.name}" for f in dataclasses.fields(TrainerConfig)]
        + [f"sampling.{f.name}" for f in dataclasses.fields(SamplingConfig)]
    )


def refuse_ignored_keys(config: TrainConfig, honoured: frozenset[str]) -> None:
    """A shared key set away from its default that the chosen backend never reads is refused: a run that
    silently ignores ``trainer.beta=0.1`` is not the experiment its command line describes."""
    from bridges.runtime.errors import ConfigError

    for section in ("trainer", "sampling"):
        ignored = ignored_key(getattr(config, section), section, honoured)
        if ignored is not None:
            raise ConfigError(
                f"backend={config.backend} does not use {ignored[0]} (set to {ignored[1]}); remove it, or pass "
                f"the backend's own setting in its {config.backend}.* section."
            )


def ignored_key(values: Any, section: str, honoured: frozenset[str]) -> tuple[str, Any] | None:
    """The first ``<section>.<key>`` of the dataclass ``values`` set away from its default but not in
    ``honoured``, with its value; None when every changed key is honoured."""
    default = type(values)()
    for f in dataclasses.fields(default):
        key, value = f"{section}.{f.name}", getattr(values, f.name)
        if key not in honoured and value != getattr(default, f.name):
            return key, value
    return None


def lora_config(t: TrainerConfig) -> Any:
    """The peft ``LoraConfig`` for ``t`` (None for full fine-tuning); every backend that trains LoRA uses it."""
    if t.lora_rank <= 0:
        return None
    from bridges.runtime.errors import require_extra

    peft = require_extra("peft", "trl", "LoRA training (trainer.lora_rank > 0)")
    return peft.LoraConfig(
        r=t.lora_rank,
        lora_alpha=t.lora_alpha,
        lora_dropout=t.lora_dropout,
        target_modules=list(t.lora_target_modules),
        task_type="CAUSAL_LM",
    )


@dataclass
class TrainConfig:
    backend: str = option(
        "grpo", help="grpo | trl | verl | tinker, or one registered by an installed package"
    )
    env: str = option("repeat_letter", help="environment id: bundled, entry point, module, or vf:<module>")
    env_args: dict[str, Any] = option(
        factory=dict, help="keyword arguments of the environment's load_environment"
    )
    model: str = option("tiny", help="'tiny' (built locally), a local checkpoint folder or a hub id")
    engine: str = option(
        "auto",
        choices=ENGINES,
        help="auto: on a GPU vllm where installed, else paged (transformers' continuous batching) with flash-attn, else hf",
    )
    run_name: str | None = option(None, help="the run's folder under output_dir; default <backend>-<env>")
    output_dir: str = option("runs", help="where run folders are written")
    seed: int = option(0, ge=0, help="seed of data order, sampling and initialisation")
    resume: bool = option(
        False, help="continue the run in <output_dir>/<run_name> from its newest intact checkpoint"
    )
    overwrite: bool = option(False, help="replace the run already in <output_dir>/<run_name>")
    save_every: int = option(0, ge=0, help="steps between checkpoints; 0 = only at the end")
    keep_checkpoints: int = option(2, ge=0, help="newest checkpoints kept; 0 = keep all")
    eval_every: int = option(
        0, ge=0, help="steps between evaluations on the environment's eval split (eval/* metrics); 0 = never"
    )
    eval_examples: int = option(0, ge=0, help="eval split rows each evaluation rolls out; 0 = all of them")
    report_to: str = option("none", choices=("none", "wandb"), help="where metrics go besides metrics.jsonl")
    progress: bool = option(True, help="a progress bar (else one line per step)")
    dry_run: bool = option(
        False, help="validate everything, print the resolved config (and backend command), exit"
    )
    wandb: WandbConfig = option(factory=WandbConfig, help="where report_to=wandb logs")
    sampling: SamplingConfig = option(factory=SamplingConfig, help="sampling of training rollouts")
    trainer: TrainerConfig = option(factory=TrainerConfig, help="the shared training keys")
    # native backend sections, passed through untouched
    trl: dict[str, Any] = option(factory=dict, help="GRPOConfig fields for backend=trl")
    verl: dict[str, Any] = option(factory=dict, help="hydra overrides for backend=verl")
    tinker: dict[str, Any] = option(factory=dict, help="options of backend=tinker")
    vllm: dict[str, Any] = option(factory=dict, help="vLLM engine arguments")

    @property
    def resolved_learning_rate(self) -> float:
        return learning_rate(self.trainer, self.model, lora=self.trainer.lora_rank > 0)

    @property
    def resolved_run_name(self) -> str:
        if self.run_name:
            return self.run_name
        return re.sub(r"[^A-Za-z0-9._+-]+|\.\.+", "-", f"{self.backend}-{self.env}").strip("-.")
