"""Packed micro-batches (``trainer.micro_batch_tokens``): the model runs a micro-batch's sequences without
padding (one row under varlen attention, else rows as long as the longest sequence), and the logprobs, gradients and the optimizer step are the padded ones (fp32,
1e-5); the packing itself keeps every sample once and within the budget; backends that pack their own
way refuse the key in one sentence."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch

from bridges.grpo.batching import collate, pack_micro_batches
from bridges.grpo.loss import sequence_logprobs
from bridges.workflows.types import TrainingSample

LENGTHS = [5, 17, 9, 30, 2, 12]


def _samples(lengths: list[int], seed: int = 0) -> list[TrainingSample]:
    rng = random.Random(seed)
    out = []
    for n in lengths:
        half = max(1, n // 2)
        out.append(TrainingSample(token_ids=[rng.randrange(3, 100) for _ in range(n)],
                                  loss_mask=[0] * half + [1] * (n - half), logprobs=[0.0] * half + [-2.0] * (n - half),
                                  advantage=rng.choice([-1.0, 0.5, 1.0])))
    return out


@pytest.mark.parametrize("varlen", [False, True], ids=["rows-of-the-longest", "one-row"])
@pytest.mark.parametrize("chunked", [True, False])
def test_packed_logprobs_and_gradients_are_the_padded_ones(tiny_path: Path, chunked: bool, varlen: bool,
                                                           monkeypatch: pytest.MonkeyPatch):
    """Without varlen kernels (sdpa here) the sequences go into rows as long as the longest (30): [30],
    [17, 12], [9, 5, 2], so the block-diagonal mask costs no more than padding; with them (flash-attention,
    faked: sdpa runs the one row block-diagonally) one row of every token."""
    from transformers import AutoModelForCausalLM

    from bridges.models import token_logprobs

    monkeypatch.setattr(token_logprobs, "varlen_attention", lambda model: varlen)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_path), dtype=torch.float32).train()
    batch = collate(_samples(LENGTHS), pad_token_id=0)
    seen: list[tuple[int, ...]] = []
    model.get_decoder().register_forward_pre_hook(lambda m, a, kw: seen.append(tuple(kw["input_ids"].shape)),
                                                  with_kwargs=True)
    results = []
    for packed in (False, True):
        logps = sequence_logprobs(model, batch.input_ids_B_L, batch.attention_mask_B_L, chunked=chunked, packed=packed)
        (logps * torch.linspace(0.5, 1.5, logps.shape[1])).sum().backward()
        results.append((logps.detach(), [p.grad.clone() for p in model.parameters()]))
        model.zero_grad(set_to_none=True)
    packed_shape = (1, sum(LENGTHS)) if varlen else (3, max(LENGTHS))
    assert seen == [(len(LENGTHS), max(LENGTHS)), packed_shape]  # padded rows, then the packed layout
    (padded, padded_grads), (packed, packed_grads) = results
    torch.testing.assert_close(packed, padded, rtol=0, atol=1e-5)
    assert padded.abs().sum() > 0
    for got, want in zip(packed_grads, padded_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_packed_rows_never_cost_more_attention_than_padding():
    from bridges.models.token_logprobs import packed_inputs

    rng = random.Random(1)
    lengths = [rng.randrange(1, 300) for _ in range(64)]
    real = torch.arange(300)[None, :] < torch.tensor(lengths)[:, None]
    ids = torch.randint(3, 100, (64, 300))
    inputs, order = packed_inputs(ids, real, max(lengths))
    rows, width = inputs["input_ids"].shape
    assert width == max(lengths) and rows * width**2 <= len(lengths) * max(lengths) ** 2  # attention (mask) cost
    assert rows * width < len(lengths) * max(lengths)  # the linear layers run fewer tokens than padded
    assert torch.equal(inputs["input_ids"].flatten()[order], ids[real])  # every token once, in its place
    one, one_order = packed_inputs(ids, real)
    assert one["input_ids"].shape == (1, sum(lengths)) and torch.equal(one["input_ids"][0][one_order], ids[real])


def test_sequences_do_not_see_each_other_in_a_packed_row(tiny_path: Path):
    """A row's logprobs do not change when another sequence is packed in front of it."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_path), dtype=torch.float32).eval()
    alone, together = collate(_samples([12]), 0), collate([_samples([30], seed=5)[0], _samples([12])[0]], 0)
    with torch.no_grad():
        one = sequence_logprobs(model, alone.input_ids_B_L, alone.attention_mask_B_L, packed=True)
        both = sequence_logprobs(model, together.input_ids_B_L, together.attention_mask_B_L, packed=True)
    assert together.input_ids_B_L[1, :12].tolist() == alone.input_ids_B_L[0].tolist()
    torch.testing.assert_close(both[1, :11], one[0, :11], rtol=0, atol=1e-5)


@pytest.mark.parametrize("budget", [1, 16, 40, 1000])
def test_packing_keeps_every_sample_once_within_the_budget(budget: int):
    samples = _samples([random.Random(i).randrange(2, 60) for i in range(40)])
    bins = pack_micro_batches(samples, budget)
    assert sorted(id(s) for b in bins for s in b) == sorted(id(s) for s in samples)
    for b in bins:
        assert len(b) == 1 or sum(len(s.token_ids) for s in b) <= budget
    if budget >= 1000:
        assert len(bins) == 2  # 40 samples of ~30 tokens: first-fit fills each bin before opening one


def _step(tiny_path: Path, settings: list[str], samples: list[TrainingSample]) -> tuple[dict[str, float], list[Any]]:
    """One optimizer step's metrics and the gradients it stepped with (taken as the optimizer steps)."""
    from bridges.grpo.parallel import World
    from bridges.grpo.trainer import build_step_context, train_step
    from bridges.models.hardware import placement
    from bridges.runs.config import parse_config
    from bridges.runs.train_config import TrainConfig

    torch.manual_seed(0)
    config = parse_config(TrainConfig, [f"model={tiny_path}", "trainer.device=cpu", "trainer.dtype=fp32",
                                        "trainer.learning_rate=1e-2", *settings])
    ctx, _ = build_step_context(config, placement("cpu", "fp32"), World())
    grads: list[Any] = []
    step = ctx.optimizer.step

    def recording_step(*args: Any, **kwargs: Any) -> Any:
        grads.extend(p.grad.detach().clone() for p in ctx.master.params if p.grad is not None)
        return step(*args, **kwargs)

    ctx.optimizer.step = recording_step  # type: ignore[method-assign]
    return train_step(ctx, samples), grads


def test_a_packed_step_is_the_padded_step(tiny_path: Path):
    samples = _samples([random.Random(i).randrange(4, 48) for i in range(12)], seed=3)
    padded, padded_grads = _step(tiny_path, ["trainer.grad_accum_steps=3"], samples)
    packed, packed_grads = _step(tiny_path, ["trainer.micro_batch_tokens=64"], samples)
    assert packed["loss"] == pytest.approx(padded["loss"], abs=1e-5)
    assert packed["grad_norm"] == pytest.approx(padded["grad_norm"], rel=1e-5)
    assert packed["tokens/trained"] == padded["tokens/trained"] == sum(len(s.token_ids) for s in samples)
    assert packed["optimizer/stepped"] == 1.0 and len(packed_grads) == len(padded_grads) > 0
    for got, want in zip(packed_grads, padded_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["trl", "verl", "tinker"])
def test_backends_that_pack_their_own_way_refuse_the_key(backend: str):
    from bridges.runs.backends import resolve_backend
    from bridges.runs.config import parse_config
    from bridges.runs.train_config import TrainConfig, refuse_ignored_keys
    from bridges.runtime.errors import ConfigError

    config = parse_config(TrainConfig, [f"backend={backend}", "trainer.micro_batch_tokens=512"])
    with pytest.raises(ConfigError, match=f"backend={backend} does not use trainer.micro_batch_tokens"):
        refuse_ignored_keys(config, resolve_backend(backend).honoured_keys)
