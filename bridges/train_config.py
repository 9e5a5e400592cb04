"""The one configuration every ``python -m bridges.train backend=<name>`` run shares.

Shared keys (environment, model, group size, learning rate, sampling) are declared once, so the
same command line means the same experiment on every backend; each backend's native settings pass
straight through in their own open section (``trl.*`` as ``GRPOConfig`` fields, ``verl.*`` as hydra
overrides, ``tinker.*``) instead of being re-declared here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SamplingConfig:
    max_tokens: int | None = None  # None: the environment's own sampling_args decide
    temperature: float = 1.0
    top_p: float = 1.0


@dataclass
class TrainerConfig:
    # schedule
    max_steps: int = 300
    batch_size: int = 16  # prompts (groups) per optimizer step
    group_size: int = 16  # rollouts per prompt
    # optimisation (defaults tuned for the embedded tiny model; real checkpoints want ~1e-6 full, ~1e-5 LoRA)
    learning_rate: float = 1.5e-3
    warmup_steps: int = 0
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    grad_accum_steps: int = 1
    # objective
    loss: str = "grpo"  # grpo | dr_grpo
    epsilon: float = 0.2
    epsilon_high: float | None = None
    ratio_cap: float | None = 4.0  # truncation of the importance ratio against the sampler
    beta: float = 0.0  # KL to a frozen reference model; 0 = no reference model
    max_completion_length: int = 512  # per-sample token budget after the prompt
    # asynchrony: generation of step k+1 overlaps training on step k
    num_batches_ahead: int = 1
    max_concurrent: int = 256  # rollouts in flight
    rollout_process: bool = (
        False  # hf engine: roll out in a child process, so generation really overlaps training
    )
    # parameter-efficient training
    lora_rank: int = 0  # 0 = full fine-tuning
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    lora_target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


def lora_config(t: TrainerConfig) -> Any:
    """The peft ``LoraConfig`` for ``t`` (None for full fine-tuning); every backend that trains LoRA uses it."""
    if t.lora_rank <= 0:
        return None
    from bridges.errors import require_extra

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
    backend: str = "grpo"
    env: str = "repeat_letter"
    env_args: dict[str, Any] = field(default_factory=dict)
    model: str = "tiny"
    engine: str = "auto"  # auto | hf | vllm (auto: vllm when a GPU and vllm are present, else hf)
    run_name: str | None = None  # default: <backend>-<env>
    output_dir: str = "runs"
    seed: int = 0
    resume: bool = False
    save_every: int = 0  # steps between checkpoints; 0 = only at the end
    keep_checkpoints: int = 2
    report_to: str = "none"  # none | wandb
    progress: bool = True
    dry_run: bool = False
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    # native backend sections, passed through untouched
    trl: dict[str, Any] = field(default_factory=dict)
    verl: dict[str, Any] = field(default_factory=dict)
    tinker: dict[str, Any] = field(default_factory=dict)
    vllm: dict[str, Any] = field(default_factory=dict)

    @property
    def resolved_run_name(self) -> str:
        return self.run_name or f"{self.backend}-{self.env}"
