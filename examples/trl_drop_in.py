"""A plain TRL GRPO script; the environment enters in the two lines marked ``# rl-bridges``.

    python examples/trl_drop_in.py [env_id] [max_steps]     # default: guess_number, 3 steps

Everything else is what a TRL user already has: a model, a tokenizer, ``GRPOConfig``,
``GRPOTrainer``. Here the model is the locally built tiny one (no download); point ``model_path``
at any checkpoint folder or hub id instead. A single-turn environment is scored through TRL's own
generation; a multi-turn or tool environment (``guess_number`` here) adds a ``rollout_func`` that
runs it token-exactly through the model TRL trains.
"""

import os
import sys

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is marked experimental in TRL 1.16

from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from bridges.adapters.trl import trl_trainer_kwargs  # rl-bridges
from bridges.models.tiny import tiny_model_path

env_id = sys.argv[1] if len(sys.argv) > 1 else "guess_number"
max_steps = int(sys.argv[2]) if len(sys.argv) > 2 else 3
model_path = str(tiny_model_path())

model = AutoModelForCausalLM.from_pretrained(model_path)
tokenizer = AutoTokenizer.from_pretrained(model_path)
args = GRPOConfig(
    output_dir="outputs/trl_drop_in",
    per_device_train_batch_size=8,
    num_generations=4,
    max_completion_length=96,
    max_steps=max_steps,
    learning_rate=1e-3,
    logging_steps=1,
    save_strategy="no",
    report_to="none",
    use_cpu=True,
    disable_tqdm=True,
)
trainer = GRPOTrainer(
    model=model, args=args, processing_class=tokenizer, **trl_trainer_kwargs(env_id)
)  # rl-bridges
trainer.train()

last = [h for h in trainer.state.log_history if "reward" in h][-1]
print(
    f"trained {trainer.state.global_step} steps on {env_id}: reward {last['reward']:.3f}, loss {last['loss']:.4f}"
)
