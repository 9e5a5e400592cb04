"""Training samples -> Tinker ``Datum``s for the RL losses (``importance_sampling``, ``ppo``, ``cispo``).

Tinker aligns every loss input with ``target_tokens`` (position ``t`` of ``model_input`` predicts
``target_tokens[t]`` = token ``t + 1``), so the sample is shifted by one here, once. The sampler's
logprobs and the advantage are 0 wherever the loss mask is 0 (prompt, environment and tool
tokens): Tinker's losses sum over tokens, and a zero advantage is how a token is left out.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bridges.workflows.types import TrainingSample


def sample_to_datum(sample: TrainingSample) -> Any:
    from tinker import types

    tokens = list(sample.token_ids)
    mask_T = np.asarray(sample.loss_mask[1:], dtype=np.float32)
    inputs: dict[str, Any] = {  # numpy arrays: the SDK converts them to its TensorData
        "target_tokens": np.asarray(tokens[1:], dtype=np.int64),
        "logprobs": np.asarray(sample.logprobs[1:], dtype=np.float32) * mask_T,
        "advantages": mask_T * np.float32(sample.advantage),
    }
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=inputs)
