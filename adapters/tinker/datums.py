"""Training samples -> Tinker ``Datum``s for the RL losses (``importance_sampling``, ``ppo``, ``cispo``).

Tinker aligns every loss input with ``target_tokens`` (position ``t`` of ``model_input`` predicts
``target_tokens[t]`` = token ``t + 1``), so the sample is shifted by one here, once. The sampler's
logprobs and the advantage are 0 wherever the loss mask is 0 (prompt, environment and tool
tokens): Tinker's losses sum over tokens, and a zero advantage is how a token is left out. The
advantages carry the step's normalisation (``token_weights``), so the sum is the mean the other backends use.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bridges.workflows.types import TrainingSample


def token_weights(samples: list[TrainingSample], aggregation: str, loss: str, max_length: int) -> list[float]:
    """What each sample's advantage is multiplied by so Tinker's token *sum* is the loss the other backends
    take the gradient of (``trainer.loss_aggregation``): 1 / (its loss tokens x the step's samples) for each
    sample's token mean averaged over samples, 1 / (the step's loss tokens) for one token mean, and dr_grpo's
    1 / (samples x max_completion_length). Without it, a step's gradient grew with its batch and lengths and
    a long failed episode pushed 8x harder than a short success (then the grad-norm clip cut it)."""
    counts = [max(1, sum(s.loss_mask[1:])) for s in samples]
    if loss == "dr_grpo":
        return [1.0 / (len(samples) * max_length)] * len(samples)
    if aggregation == "token":
        return [1.0 / sum(counts)] * len(samples)
    return [1.0 / (n * len(samples)) for n in counts]


def sample_to_datum(sample: TrainingSample, weight: float = 1.0) -> Any:
    from tinker import types

    tokens = list(sample.token_ids)
    mask_T = np.asarray(sample.loss_mask[1:], dtype=np.float32)
    inputs: dict[str, Any] = {  # numpy arrays: the SDK converts them to its TensorData
        "target_tokens": np.asarray(tokens[1:], dtype=np.int64),
        "logprobs": np.asarray(sample.logprobs[1:], dtype=np.float32) * mask_T,
        "advantages": mask_T * np.float32(sample.advantage * weight),
    }
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=inputs)
