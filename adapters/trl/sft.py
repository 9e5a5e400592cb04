"""``bridges.sft`` on TRL's ``SFTTrainer``: the dataset's own token ids, loss only on sampled tokens.

The dataset reaches TRL pre-tokenized, with ``labels`` = the ids where the assistant mask is 1 and
-100 elsewhere, which TRL uses as given: nothing is re-rendered or re-tokenised, so supervised
training sees exactly the tokens the rollouts sampled.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from bridges.adapters.trl.metrics_file import metrics_callback
from bridges.runtime.errors import require_extra


def training_rows(data: str) -> Any:
    """The dataset as ``input_ids`` and ``labels`` (-100 where the assistant mask is 0)."""
    from datasets import load_from_disk

    dataset = load_from_disk(data)

    def labelled(row: dict[str, Any]) -> dict[str, Any]:
        ids, mask = row["input_ids"], row["assistant_masks"]
        return {"input_ids": ids, "labels": [t if m else -100 for t, m in zip(ids, mask, strict=True)]}

    return dataset.map(labelled, remove_columns=dataset.column_names)


def sft_metric_row(step: int, logs: dict[str, Any]) -> dict[str, Any] | None:
    """An SFT training log line (the ones with a loss) as a ``metrics.jsonl`` row."""
    if "loss" not in logs:
        return None
    return {"step": step, "loss": logs["loss"], "lr": logs.get("learning_rate"),
            "grad_norm": logs.get("grad_norm"), "tokens/seen": logs.get("num_tokens")}


def _sft_args(config: Any, run_dir: Path) -> Any:
    from trl import SFTConfig

    from bridges.models.hardware import placement
    from bridges.runs.train_config import learning_rate

    t = config.trainer
    where = placement(t.device, t.dtype)  # the Trainer's mixed precision: fp32 weights, autocast forward
    return SFTConfig(
        output_dir=str(run_dir), max_steps=t.max_steps, per_device_train_batch_size=t.batch_size,
        gradient_accumulation_steps=t.grad_accum_steps, learning_rate=learning_rate(t, config.model, lora=t.lora_rank > 0), warmup_steps=t.warmup_steps,
        weight_decay=t.weight_decay, max_grad_norm=t.max_grad_norm, lr_scheduler_type="constant_with_warmup",
        logging_steps=1, save_strategy="steps", save_steps=config.save_every or t.max_steps,
        save_total_limit=config.keep_checkpoints or None, report_to=[], seed=config.seed, data_seed=config.seed,
        disable_tqdm=not config.progress, max_length=config.max_length, use_cpu=where.device.type == "cpu",
        bf16=str(where.dtype) == "torch.bfloat16", fp16=str(where.dtype) == "torch.float16",
        gradient_checkpointing=t.gradient_checkpointing == "full", **config.sft,
    )


def run_sft(config: Any, run_dir: Path) -> int:
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    require_extra("trl", "trl", "bridges.sft")
    import torch
    from transformers import AutoTokenizer
    from trl import SFTTrainer

    from bridges.adapters.trl.checkpoints import resume_point
    from bridges.models.hardware import load_causal_lm, placement
    from bridges.models.tiny import resolve_model_path
    from bridges.runs.metrics import MetricsLogger, plot_curve
    from bridges.runs.train_config import lora_config

    path = resolve_model_path(config.model)
    where = placement(config.trainer.device, config.trainer.dtype)
    tokenizer, model = AutoTokenizer.from_pretrained(path), load_causal_lm(path, where, weights_dtype=torch.float32)
    resume, step = resume_point(run_dir, config.resume)
    logger = MetricsLogger(run_dir, dataclasses.asdict(config), "none", resume_step=step)
    trainer = SFTTrainer(model=model, args=_sft_args(config, run_dir), train_dataset=training_rows(config.data),
                         processing_class=tokenizer, peft_config=lora_config(config.trainer),
                         callbacks=[metrics_callback(sft_metric_row, logger)])
    try:
        trainer.train(resume_from_checkpoint=resume)
    finally:
        logger.close()
    trained: Any = trainer.model
    final = trained.merge_and_unload() if config.trainer.lora_rank > 0 else trained  # a plain model folder
    final.save_pretrained(run_dir / "final")
    tokenizer.save_pretrained(run_dir / "final")
    title = f"{config.data} · {config.model} · sft"
    curve = plot_curve(logger.rows, "loss", "loss", run_dir / "loss_curve.png", title)
    losses = [r["loss"] for r in logger.rows if r.get("loss") is not None]
    if losses:
        print(f"loss: first step {losses[0]:.3f} -> last step {losses[-1]:.3f} over {len(losses)} steps")
    files = ["metrics.jsonl", "final/ (a model folder: model=" + str(run_dir / "final") + ")"]
    print(f"run written to {run_dir} ({', '.join(files + (['loss_curve.png'] if curve else []))})")
    return 0
