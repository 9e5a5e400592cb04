"""``trainer.kernels=compile``: every decoder layer through torch.compile gives the eager logprobs and
gradients, padded and packed, and a packed step after it; a bad choice is one sentence; backends that
do not train the model in this process refuse the key."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from bridges.grpo.batching import collate
from bridges.grpo.loss import sequence_logprobs
from bridges.models.fused import apply_kernels
from bridges.models.recompute import checkpointed_layers
from bridges.workflows.types import TrainingSample


def _batch(lengths: list[int]) -> object:
    generator = torch.Generator().manual_seed(0)
    samples = [TrainingSample(token_ids=torch.randint(3, 100, (n,), generator=generator).tolist(),
                              loss_mask=[0] * (n // 2) + [1] * (n - n // 2), logprobs=[0.0] * n, advantage=1.0)
               for n in lengths]
    return collate(samples, pad_token_id=0)


def test_compiled_layers_give_the_eager_logprobs_and_gradients(tiny_path: Path):
    from transformers import AutoModelForCausalLM

    eager = AutoModelForCausalLM.from_pretrained(str(tiny_path), dtype=torch.float32).train()
    compiled = copy.deepcopy(eager)
    assert apply_kernels(compiled, "compile") == len(checkpointed_layers(compiled)) > 0
    assert apply_kernels(eager, "eager") == 0
    torch._dynamo.reset()
    for lengths, packed in (([7, 19, 11], False), ([7, 19, 11], True), ([5, 23], True)):  # new shapes: dynamic
        batch = _batch(lengths)
        outputs = []
        for model in (eager, compiled):
            logps = sequence_logprobs(model, batch.input_ids_B_L, batch.attention_mask_B_L, packed=packed)
            logps.sum().backward()
            outputs.append((logps.detach(), [p.grad.clone() for p in model.parameters()]))
            model.zero_grad(set_to_none=True)
        (want, want_grads), (got, got_grads) = outputs
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        for g, w in zip(got_grads, want_grads, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert frames >= 1  # the layers really ran compiled


def test_the_setting_is_checked_and_other_backends_refuse_it():
    from bridges.runs.backends import resolve_backend
    from bridges.runs.config import parse_config
    from bridges.runs.train_config import TrainConfig, refuse_ignored_keys
    from bridges.runtime.errors import ConfigError

    with pytest.raises(ConfigError, match="trainer.kernels must be one of eager, compile"):
        parse_config(TrainConfig, ["trainer.kernels=fast"])
    for backend in ("trl", "verl", "tinker"):
        config = parse_config(TrainConfig, [f"backend={backend}", "trainer.kernels=compile"])
        with pytest.raises(ConfigError, match=f"backend={backend} does not use trainer.kernels"):
            refuse_ignored_keys(config, resolve_backend(backend).honoured_keys)
