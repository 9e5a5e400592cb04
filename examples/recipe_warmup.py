"""The whole workflow on one task: evaluate, collect a teacher's rollouts, filter, SFT warm-up, RL, evaluate.

    cd examples && python recipe_warmup.py [output folder, default runs/recipe]

``reverse_text`` asks for the reversed text inside ``<answer>`` tags; the tiny random model never
writes the tags, so it scores 0 and RL alone has nothing to reinforce. The commands below are the
ones a user types (each stage is a CLI; this script only runs them in order and reads the rewards):

    python -m bridges.eval   env=reverse_text env_args=... model=tiny output=<out>/before
    python -m bridges.eval   env=reverse_text env_args=... engine=reverse_teacher:ReverseTextTeacher split=train output=<out>/teacher
    python -m bridges.export rollouts=<out>/teacher min_reward=0.99 output=<out>/sft_data
    python -m bridges.sft    data=<out>/sft_data output_dir=<out> run_name=sft trainer.max_steps=300 ...
    python -m bridges.eval   env=reverse_text env_args=... model=<out>/sft/final output=<out>/after_sft
    python -m bridges.train  env=reverse_text env_args=... model=<out>/sft/final output_dir=<out> run_name=rl ...
    python -m bridges.eval   env=reverse_text env_args=... model=<out>/rl/checkpoints/step_000080/model output=<out>/after_rl

Last line: before=<r> after_sft=<r> after_rl=<r>  (mean reward on the 50 held-out examples)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ENV = ["env=reverse_text", "env_args={min_words: 1, max_words: 2, num_train: 500, num_eval: 50}"]
RL_STEPS = 80


def bridges(*args: str) -> None:
    quiet = [] if args[0] == "bridges.export" else ["progress=false"]
    done = subprocess.run([sys.executable, "-m", *args, *quiet], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args[:2])} failed:\n{done.stderr[-3000:]}")


def evaluate(out: Path, name: str, model: str, *extra: str) -> float:
    bridges("bridges.eval", *ENV, f"model={model}", f"output={out / name}", *extra)
    rewards = [json.loads(line)["reward"] for line in (out / name / "results.jsonl").read_text().splitlines()]
    return sum(r or 0.0 for r in rewards) / len(rewards)


def main(out: Path) -> None:
    before = evaluate(out, "before", "tiny")
    evaluate(out, "teacher", "tiny", "engine=reverse_teacher:ReverseTextTeacher", "split=train")
    bridges("bridges.export", f"rollouts={out / 'teacher'}", "min_reward=0.99", f"output={out / 'sft_data'}")
    bridges("bridges.sft", f"data={out / 'sft_data'}", f"output_dir={out}", "run_name=sft", "trainer.max_steps=300",
            "trainer.batch_size=16", "trainer.learning_rate=3e-3")
    after_sft = evaluate(out, "after_sft", str(out / "sft" / "final"))
    bridges("bridges.train", *ENV, f"model={out / 'sft' / 'final'}", f"output_dir={out}", "run_name=rl",
            f"trainer.max_steps={RL_STEPS}", "trainer.batch_size=8", "trainer.group_size=8",
            "trainer.learning_rate=5e-4")
    after_rl = evaluate(out, "after_rl", str(out / "rl" / "checkpoints" / f"step_{RL_STEPS:06d}" / "model"))
    print(f"before={before:.3f} after_sft={after_sft:.3f} after_rl={after_rl:.3f}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/recipe").resolve())
