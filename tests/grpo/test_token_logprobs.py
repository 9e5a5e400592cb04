"""The logprob step without all B×L×V logits: equal to the plain computation, and refused where it
would not be."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from bridges.models.token_logprobs import chunked_matches_plain, token_logprobs


def inputs(vocab: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (3, 17), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, 12:] = 0  # a right-padded row
    wanted = (torch.rand(ids.shape, generator=generator) > 0.4).long() * mask
    return ids, mask, torch.roll(ids, -1, dims=1), wanted


def both_ways(model: Any, vocab: int, temperature: float, chunk: int) -> tuple[torch.Tensor, ...]:
    ids, mask, targets, wanted = inputs(vocab)
    results, grads = [], []
    for chunked in (False, True):
        model.zero_grad()
        out = token_logprobs(model, ids, mask, targets, wanted, temperature=temperature, chunk_tokens=chunk,
                             chunked=chunked)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        results.append(out.detach())
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    return results[0], results[1], grads[0], grads[1], wanted


@pytest.mark.parametrize(("temperature", "chunk"), [(1.0, 4), (0.7, 1), (1.3, 1000)])
def test_chunked_logprobs_and_their_gradients_equal_the_plain_computation(tiny_path, temperature, chunk):
    model = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    plain, chunked, plain_grad, chunked_grad, wanted = both_ways(model, model.config.vocab_size, temperature, chunk)
    assert (plain[wanted == 0] == 0).all() and (chunked[wanted == 0] == 0).all()
    assert (plain - chunked).abs().max().item() < 1e-6
    torch.testing.assert_close(chunked_grad, plain_grad, atol=1e-5, rtol=1e-5)  # sums in another order


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """At a 152k vocabulary logprobs sit near -12, where one float32 step is ~1e-6 wide."""
    return ((a - b).abs() / a.abs().clamp(min=1.0)).max().item()


@pytest.mark.parametrize("targets", [["q_proj", "v_proj"], ["q_proj", "lm_head"]], ids=["attention", "head-too"])
def test_the_same_through_a_lora_adapter_on_a_real_vocabulary(bridges_cache_dir, targets):
    """An adapter on the head (Tinker's train_unembed) takes the generic checkpointed chunks; otherwise
    the head's own backward (``HeadLogprobs``) runs."""
    import peft

    from bridges.models.family_models import family_model_path

    model = AutoModelForCausalLM.from_pretrained(family_model_path("tiny-qwen2.5"), dtype=torch.float32)
    lora = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=targets))
    assert (type(lora.get_output_embeddings()) is torch.nn.Linear) == ("lm_head" not in targets)
    with torch.no_grad():
        for name, param in lora.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.1)  # B starts at zero: make the adapter matter
    plain, chunked, plain_grad, chunked_grad, _ = both_ways(lora, model.config.vocab_size, 1.0, 5)
    assert relative_error(plain, chunked) < 1e-6
    scale = plain_grad.abs().max().item()  # each gradient sums over 152k vocabulary rows, in another order
    torch.testing.assert_close(chunked_grad, plain_grad, atol=1e-4 * scale, rtol=1e-4)
    assert chunked_matches_plain(lora, model.config.vocab_size)


class SoftCapped(torch.nn.Module):
    """A model whose forward changes its logits after the projection (Gemma 2's soft-capping): the split
    would miss it, so the probe must say no."""

    def __init__(self, inner: Any) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, **kwargs: Any) -> Any:
        out = self.inner(**kwargs)
        out.logits = 30.0 * torch.tanh(out.logits / 30.0) if out.logits.numel() else out.logits
        return out

    def get_decoder(self) -> Any:
        return self.inner.get_decoder()

    def get_output_embeddings(self) -> Any:
        return self.inner.get_output_embeddings()


def test_a_model_that_transforms_its_logits_falls_back_to_the_plain_computation(tiny_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(200.0)  # logits large enough for the cap to matter
    assert chunked_matches_plain(model, model.config.vocab_size)
    assert not chunked_matches_plain(SoftCapped(model), model.config.vocab_size)


def test_a_half_heads_gradient_is_summed_over_chunks_and_micro_batches_in_fp32():
    """bf16 weights: the head's chunked gradient goes into the master's fp32 gradient (or, without a
    master, an fp32 sum rounded once), and micro-batches add up on the master in fp32."""
    from bridges.grpo.precision import MasterWeights
    from bridges.models.token_logprobs import HeadLogprobs

    torch.manual_seed(0)
    head = torch.nn.Linear(32, 300, bias=False).to(torch.bfloat16)
    master = MasterWeights(head)
    hidden = torch.randn(512, 32, dtype=torch.bfloat16)
    targets = torch.randint(0, 300, (512,))
    exact = torch.zeros(300, 32)
    for part in (hidden[:256], hidden[256:]):  # two micro-batches, 64 chunks of 4 rows each
        weight = head.weight.detach().float().requires_grad_()
        logits = part.float() @ weight.T
        (logits.gather(-1, targets[: len(part), None]) - logits.logsumexp(-1, keepdim=True)).sum().backward()
        exact += weight.grad
        HeadLogprobs.apply(part, head.weight, targets[: len(part)], 1.0, 4, master.fp32_grad(head.weight)).sum().backward()
    master.grads_to_master()
    [(_, _, fp32_master)] = master.pairs
    assert fp32_master.grad.dtype == torch.float32 and head.weight.grad is None
    fp32_error = (fp32_master.grad - exact).abs().max().item()
    # without a master: the chunks summed in fp32 and rounded into the bf16 gradient once
    plain = torch.nn.Parameter(head.weight.detach().clone())  # a half weight with no master (FSDP's gathered one)
    HeadLogprobs.apply(hidden[:256], plain, targets[:256], 1.0, 4).sum().backward()
    first = plain.grad.float()
    weight = head.weight.detach().float().requires_grad_()
    logits = hidden[:256].float() @ weight.T
    (logits.gather(-1, targets[:256, None]) - logits.logsumexp(-1, keepdim=True)).sum().backward()
    rounded_once = (first - weight.grad).abs().max().item()
    assert fp32_error < 0.02 * exact.abs().max().item(), fp32_error  # per-chunk bf16 products only
    assert rounded_once <= 2 ** -7 * weight.grad.abs().max().item() + fp32_error, rounded_once


def test_the_cuda_head_path_writes_fp32_products_in_one_kernel_per_chunk(monkeypatch):
    """On CUDA the head's products are written in fp32 by the matmul itself (``out_dtype``): logits never
    rounded to bf16, the head gradient one fp32-accumulating matmul per chunk instead of a slice per 8,192
    vocabulary rows. CUDA cannot run here: the path runs on the meta device (shapes, dtypes, which ops),
    its numbers are checked against fp32 by benchmarks/logprob_probe.py on a GPU."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from bridges.models import token_logprobs as tl

    assert not tl.fp32_accumulation(torch.device("cpu")) and tl.default_chunk_tokens(torch.device("cpu")) == 256
    assert tl.default_chunk_tokens(torch.device("cuda")) == 1024
    monkeypatch.setattr(tl, "fp32_accumulation", lambda device: True)
    hidden = torch.randn(50, 16, dtype=torch.bfloat16, device="meta", requires_grad=True)
    weight = torch.nn.Parameter(torch.randn(20000, 16, dtype=torch.bfloat16, device="meta"))
    sink = torch.zeros(20000, 16, device="meta")
    ops: list[str] = []

    class Log(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ops.append(str(func))
            return func(*args, **(kwargs or {}))

    with Log():
        out = tl.HeadLogprobs.apply(hidden, weight, torch.randint(0, 20000, (50,), device="meta"), 1.0, 16, sink)
        out.sum().backward()
    assert out.dtype == torch.float32 and hidden.grad.dtype == torch.bfloat16
    # 4 chunks: 4 fp32 products forward, 4 recomputed + 4 gradient sums backward, no vocabulary slices
    assert ops.count("aten.mm.dtype") == 8 and ops.count("aten.addmm.dtype_out") == 4


def test_the_cpu_head_path_is_unchanged():
    from bridges.models.token_logprobs import fp32_product

    a, b = torch.randn(8, 32, dtype=torch.bfloat16), torch.randn(32, 40, dtype=torch.bfloat16)
    assert torch.equal(fp32_product(a, b), (a @ b).float())
