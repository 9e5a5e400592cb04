"""The policy the GRPO trainer trains and the engine that samples it.

Shared by the trainer and the rollout child process (``rollout_process``), which builds its own
copy of the policy: keeping it here lets both import it without importing each other.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from bridges.engines import engine_class
from bridges.train_config import TrainConfig, lora_config
from bridges.types import TrainableEngine


def load_policy(config: TrainConfig) -> tuple[torch.nn.Module, Any]:
    """The trainable policy (optionally LoRA-wrapped) and its tokenizer, through from_pretrained."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from bridges.tiny import resolve_model_path

    path = resolve_model_path(config.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    policy = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    lora = lora_config(config.trainer)
    if lora is not None:
        from bridges.errors import require_extra

        policy = require_extra("peft", "trl", "LoRA training").get_peft_model(policy, lora)
    return policy, tokenizer


def make_engine(config: TrainConfig, policy: torch.nn.Module, tokenizer: Any) -> Any:
    """The generation engine behind the client: vLLM on a GPU, the transformers engine otherwise."""
    choice = config.engine
    if choice == "auto":
        choice = "vllm" if torch.cuda.is_available() and _vllm_installed() else "hf"
    if choice == "vllm":
        return engine_class("vllm").for_training(config, policy, tokenizer)
    # The engine gets its own copy of the weights: training mutates the policy in another thread
    # while the engine samples the next batch, and a batch must never see half-updated weights.
    engine_model = copy.deepcopy(policy).eval()
    return engine_class("hf")(engine_model, tokenizer, max_batch_size=max(64, config.trainer.group_size))


def _vllm_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


async def sync_weights(engine: TrainableEngine, policy: torch.nn.Module) -> None:
    """Push the new policy weights to the engine; its weight_version increments.

    Only trainable tensors travel (the LoRA matrices when training an adapter).
    """
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    state = {k: v for k, v in policy.state_dict().items() if k in trainable}
    await engine.aupdate_weights(state, policy=policy)
