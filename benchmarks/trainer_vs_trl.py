"""bridges.grpo vs TRL GRPOTrainer: same tiny model, environment, batch, group size and step count.

Both train the embedded default task (``repeat_letter``, reward = share of the first 6 characters
equal to the prompted letter) from the same random initialisation on this CPU, one after the other
in one process. bridges.grpo runs with its transformers engine and async generation on
(``num_batches_ahead=1``); TRL runs its own in-process generation (no vLLM). Samples/s counts
completions trained per wall-clock second of the training call; reward is the mean reward over the
last quarter of the steps, i.e. at an equal number of samples seen.

Last line: grpo_samples_per_s=<float> trl_samples_per_s=<float> ratio=<grpo/trl> grpo_reward=<float> trl_reward=<float>
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def run_bridges(args: argparse.Namespace, out: Path) -> tuple[float, list[float]]:
    from bridges.grpo.trainer import run
    from bridges.runs.config import parse_config
    from bridges.runs.train_config import TrainConfig

    config = parse_config(
        TrainConfig,
        [
            f"output_dir={out}", "progress=false", f"seed={args.seed}", f"trainer.max_steps={args.steps}",
            f"trainer.batch_size={args.batch_size}", f"trainer.group_size={args.group_size}",
            f"trainer.learning_rate={args.lr}", "trainer.num_batches_ahead=1",
            f"trainer.rollout_process={str(args.rollout_process).lower()}",
        ],
    )
    run(config)
    rows = [json.loads(x) for x in (out / "grpo-repeat_letter" / "metrics.jsonl").read_text().splitlines()]
    # the training loop's own clock (like TRL's trainer.train()): model loading and imports excluded
    return rows[-1]["timing/elapsed_s"], [r["reward/mean"] for r in rows]


def run_trl(args: argparse.Namespace, out: Path) -> tuple[float, list[float]]:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from bridges.envs.registry import load_environment
    from bridges.models.tiny import tiny_model_path

    env = load_environment("repeat_letter")
    reward_fn = env.rubric.get_reward_funcs()[0]
    rows = [dict(r) for r in env.get_dataset()]
    data = Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in rows])

    def repeated_letter(completions, answer, **_):
        return [float(reward_fn(completion=c, answer=a)) for c, a in zip(completions, answer, strict=True)]

    torch.manual_seed(args.seed)
    path = tiny_model_path()
    config = GRPOConfig(
        output_dir=str(out), per_device_train_batch_size=args.batch_size * args.group_size,
        num_generations=args.group_size, max_completion_length=6, max_steps=args.steps,
        learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=1.0,
        weight_decay=0.0, beta=0.0, loss_type="grpo", temperature=1.0, use_vllm=False, use_cpu=True,
        bf16=False, report_to="none", save_strategy="no", logging_steps=1, seed=args.seed,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(path), reward_funcs=repeated_letter, args=config,
        train_dataset=data, processing_class=AutoTokenizer.from_pretrained(path),
    )
    started = time.perf_counter()
    trainer.train()
    elapsed = time.perf_counter() - started
    return elapsed, [h["reward"] for h in trainer.state.log_history if "reward" in h]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--rollout-process",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="bridges.grpo rolls out in a child process (trainer.rollout_process)",
    )
    args = parser.parse_args()
    samples = args.steps * args.batch_size * args.group_size
    tail = max(1, args.steps // 4)
    with tempfile.TemporaryDirectory() as tmp:
        grpo_s, grpo_rewards = run_bridges(args, Path(tmp) / "grpo")
        trl_s, trl_rewards = run_trl(args, Path(tmp) / "trl")
    grpo_rate, trl_rate = samples / grpo_s, samples / trl_s
    grpo_reward = sum(grpo_rewards[-tail:]) / tail
    trl_reward = sum(trl_rewards[-tail:]) / tail
    print(
        f"{args.steps} steps x {args.batch_size} prompts x {args.group_size} rollouts = {samples} samples per trainer"
    )
    print(
        f"bridges.grpo: {grpo_s:.1f} s, reward first/last {tail} steps {sum(grpo_rewards[:tail]) / tail:.3f} -> {grpo_reward:.3f}"
    )
    print(
        f"TRL GRPOTrainer: {trl_s:.1f} s, reward first/last {tail} steps {sum(trl_rewards[:tail]) / tail:.3f} -> {trl_reward:.3f}"
    )
    print(
        f"grpo_samples_per_s={grpo_rate:.2f} trl_samples_per_s={trl_rate:.2f} ratio={grpo_rate / trl_rate:.2f} "
        f"grpo_reward={grpo_reward:.4f} trl_reward={trl_reward:.4f}"
    )


if __name__ == "__main__":
    main()
