"""The hf engine's fixed-shape decode (``adapters/hf/static_decode.py``), on the CPU with CUDA graphs off:
the same ids, finish reasons and logprobs as the eager loop (``decode.generate_batch``) for greedy and
seeded sampling, across shrinking buckets, stop strings, stop ids and abandoned rows; no host
synchronisation inside a step; the counter-based noise equal to its plain-integer definition."""

from __future__ import annotations

import asyncio
import logging
import math
import random
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from bridges.adapters.hf.decode import RowRequest, generate_batch
from bridges.adapters.hf.sampling import mix64, row_seed, signed64, uniform_reference, uniforms
from bridges.adapters.hf.static_decode import StaticDecoder, arena_length, bucket_for
from bridges.envs.types import SamplingParams

CPU = torch.device("cpu")
# ops that make the host wait for the device (a value read back, or a shape that depends on values)
SYNCING_OPS = {"aten._local_scalar_dense.default", "aten.item.default", "aten.nonzero.default",
               "aten.masked_select.default", "aten.is_nonzero.default", "aten.equal.default",
               "aten.unique_consecutive.default", "aten._unique2.default", "aten.repeat_interleave.Tensor"}


def make_rows(tokenizer: Any, count: int, params: SamplingParams, *, lengths: list[int] | None = None,
              stop_ids: frozenset[int] = frozenset()) -> list[RowRequest]:
    rows = []
    for i in range(count):
        prompt = tokenizer.encode(f"row {i} says " + "la " * (i % 5))
        max_new = lengths[i % len(lengths)] if lengths else params.max_tokens
        seed = None if params.seed is None else row_seed(params.seed, i)
        rows.append(RowRequest(prompt, params, max_new, seed, stop_ids))
    return rows


def decoder(model: Any, tokenizer: Any, rows: int = 64) -> StaticDecoder:
    return StaticDecoder(model, tokenizer, max_rows=rows, pad_token_id=0, device=CPU, cuda_graphs=False)


def assert_same(static: list[Any], loop: list[Any]) -> None:
    assert [r.token_ids for r in static] == [r.token_ids for r in loop]
    assert [(r.finish_reason, r.stop_str) for r in static] == [(r.finish_reason, r.stop_str) for r in loop]
    for a, b in zip(static, loop, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def loop(model: Any, tokenizer: Any, rows: list[RowRequest]) -> list[Any]:
    return generate_batch(model, tokenizer, rows, pad_token_id=0, device=CPU, logits_to_keep=True)


def test_counter_noise_is_its_plain_integer_definition():
    rng = random.Random(0)
    seeds = [0, 1, (1 << 63) - 1, *(rng.randrange(1 << 63) for _ in range(20))]
    for step in (0, 1, 7, 1000, 123456789):
        got = uniforms(torch.tensor([signed64(mix64(seed)) for seed in seeds]), step_counter_of(step), 50)
        assert got.shape == (len(seeds), 50)
        for row, seed in enumerate(seeds):
            for entry in (0, 1, 17, 49):
                assert got[row, entry].item() == uniform_reference(seed, step, entry)
        assert bool(((got > 0) & (got < 1)).all())
    # roughly uniform, and independent across rows, steps and entries
    draws = uniforms(torch.arange(64), step_counter_of(3), 4096)
    assert abs(draws.mean().item() - 0.5) < 0.01 and abs(draws.var().item() - 1 / 12) < 0.005
    again = uniforms(torch.arange(64), step_counter_of(4), 4096)
    assert abs(torch.corrcoef(torch.stack([draws.flatten(), again.flatten()]))[0, 1].item()) < 0.01


def test_the_samples_of_one_request_draw_unrelated_streams():
    """Sample i+1's noise is not sample i's one token later (row_seed spaces samples by the counter's own
    increment: the seed is mixed before the counter is added)."""
    from bridges.adapters.hf.sampling import BatchSampler, step_counter

    seeds = [row_seed(7, i) for i in range(8)]
    sampler = BatchSampler([SamplingParams(max_tokens=1)] * 8, seeds, 1000, CPU)
    noise = [uniforms(sampler.seeds, step_counter(k), 1000) for k in range(3)]
    for i in range(7):
        assert not torch.equal(noise[1][i + 1], noise[2][i]) and not torch.equal(noise[0][i + 1], noise[1][i])


def test_a_draw_is_the_distribution_and_survives_last_bit_differences():
    """Gumbel-max over counter noise draws from softmax(logits), and logits that differ in their last bits
    (another batch shape, another attention path) give the same ids at a real vocabulary's size."""
    from bridges.adapters.hf.sampling import BatchSampler, step_counter

    vocab, rows = 151936, 32
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0)) * 2
    sampler = BatchSampler([SamplingParams(max_tokens=1)] * rows, list(range(rows)), vocab, CPU)
    nudged = logits * (1 + 1e-6 * torch.randn(rows, vocab, generator=torch.Generator().manual_seed(1)))
    same = [torch.equal(sampler.sample(logits, step_counter(k))[0], sampler.sample(nudged, step_counter(k))[0])
            for k in range(8)]
    assert all(same)
    small = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).repeat(4000, 1)
    draws = BatchSampler([SamplingParams(max_tokens=1)] * 4000, list(range(4000)), 4, CPU).sample(small, 5)[0]
    observed = torch.bincount(draws, minlength=4).float() / 4000
    assert torch.allclose(observed, torch.softmax(small[0], -1), atol=0.025), observed


def step_counter_of(step: int) -> int:
    from bridges.adapters.hf.sampling import step_counter

    return step_counter(step)


def test_buckets_and_lengths_are_powers_of_two_with_floors():
    assert [bucket_for(n, 256) for n in (1, 8, 9, 33, 64, 65, 256)] == [8, 8, 16, 64, 64, 128, 256]
    assert bucket_for(300, 256) == 300  # a batch larger than every bucket runs at its own size
    assert [arena_length(n) for n in (1, 64, 65, 300)] == [64, 64, 128, 512]


@pytest.mark.parametrize("params", [
    SamplingParams(max_tokens=24, temperature=0.0),
    SamplingParams(max_tokens=24, temperature=1.0, seed=3),
    SamplingParams(max_tokens=24, temperature=0.7, top_k=6, top_p=0.8, seed=9),
], ids=["greedy", "seeded", "top-k-p"])
def test_fixed_shapes_give_the_eager_loops_samples_as_buckets_shrink(tiny_model, tiny_tokenizer, params):
    # 40 rows whose lengths differ, so the live rows fall from a bucket of 64 through 32, 16 and 8
    lengths = [1, 2, 3, 5, 8, 13, 21, 24]
    rows = lambda: make_rows(tiny_tokenizer, 40, params, lengths=lengths)  # noqa: E731
    static = decoder(tiny_model, tiny_tokenizer)
    assert_same(static.generate(rows()), loop(tiny_model, tiny_tokenizer, rows()))
    [arena] = static._arenas.values()
    assert {size for size, _ in arena.steps} == {64, 32, 16, 8}


def test_stop_strings_stop_ids_and_a_second_batch_on_the_same_arena(tiny_model, tiny_tokenizer):
    free = loop(tiny_model, tiny_tokenizer, make_rows(tiny_tokenizer, 12, SamplingParams(max_tokens=30, seed=1)))
    text = tiny_tokenizer.decode(free[0].token_ids)
    params = SamplingParams(max_tokens=30, seed=1, stop=[text[4:6], "never-said"])
    stop_ids = frozenset({next(t for t in free[1].token_ids[2:] if t not in free[0].token_ids)})
    rows = lambda: make_rows(tiny_tokenizer, 12, params, stop_ids=stop_ids)  # noqa: E731
    static = decoder(tiny_model, tiny_tokenizer)
    first, want = static.generate(rows()), loop(tiny_model, tiny_tokenizer, rows())
    assert_same(first, want)
    assert first[0].finish_reason == "stop" and first[0].stop_str == text[4:6]
    assert first[1].finish_reason == "stop" and first[1].token_ids[-1] in stop_ids
    assert_same(static.generate(rows()), want)  # the arena and its steps serve the next batch unchanged
    assert len(static._arenas) == 1


def test_abandoned_rows_end_at_the_next_read_and_leave_the_others_alone(tiny_model, tiny_tokenizer):
    params = SamplingParams(max_tokens=20, seed=4)
    rows = make_rows(tiny_tokenizer, 10, params)
    for row in rows[::3]:
        row.abandoned.set()
    got = decoder(tiny_model, tiny_tokenizer).generate(rows)
    want = loop(tiny_model, tiny_tokenizer, make_rows(tiny_tokenizer, 10, params))
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        if i % 3 == 0:
            assert a.finish_reason == "abort" and a.token_ids == b.token_ids[: len(a.token_ids)]
            assert len(a.token_ids) == 1  # the prefill's id, then the row leaves
        else:
            assert (a.token_ids, a.finish_reason) == (b.token_ids, b.finish_reason)


class _OpLog(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("params", [SamplingParams(max_tokens=6, seed=2, top_k=5, top_p=0.9),
                                    SamplingParams(max_tokens=6, temperature=0.0)], ids=["sampled", "greedy"])
def test_a_decode_step_never_makes_the_host_wait(tiny_model, tiny_tokenizer, params):
    static = decoder(tiny_model, tiny_tokenizer, rows=16)
    static.generate(make_rows(tiny_tokenizer, 3, params))
    [arena] = static._arenas.values()
    [step] = arena.steps.values()
    log = _OpLog()
    with torch.inference_mode(), log:
        step()
    assert "aten.scaled_dot_product_attention.default" in log.ops and "aten.index_copy_.default" in log.ops
    assert not SYNCING_OPS & set(log.ops)


def test_eager_attention_takes_an_additive_mask_and_the_same_samples(tiny_path, tiny_tokenizer):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_path, attn_implementation="eager").eval()
    params = SamplingParams(max_tokens=12, seed=5)
    rows = lambda: make_rows(tiny_tokenizer, 9, params, lengths=[3, 12])  # noqa: E731
    static = decoder(model, tiny_tokenizer)
    assert static.mask_dtype == torch.float32
    assert_same(static.generate(rows()), loop(model, tiny_tokenizer, rows()))


async def test_the_engine_keeps_seeds_routes_top_logprobs_to_the_loop_and_follows_weight_updates(
        tiny_path, tiny_tokenizer):
    from transformers import AutoModelForCausalLM

    from bridges.adapters.hf import HFEngine

    static_model = AutoModelForCausalLM.from_pretrained(tiny_path).eval()
    loop_model = AutoModelForCausalLM.from_pretrained(tiny_path).eval()
    static, plain = HFEngine(static_model, tiny_tokenizer, static_cache=True), HFEngine(loop_model, tiny_tokenizer)
    assert (static.static_cache, static.cuda_graphs, plain.static_cache) == (True, False, False)
    prompt = tiny_tokenizer.encode("the engine")
    params = SamplingParams(max_tokens=16, seed=8)

    async def both(p: SamplingParams, n: int = 6) -> tuple[list[Any], list[Any]]:
        return await asyncio.gather(static.generate(prompt, p, n), plain.generate(prompt, p, n))

    got, want = await both(params)
    assert [s.token_ids for s in got] == [s.token_ids for s in want] and static._static.verified
    got, want = await both(SamplingParams(max_tokens=4, seed=8, top_logprobs=3), 2)
    assert got[0].top_logprobs == want[0].top_logprobs and len(got[0].top_logprobs) == 4
    bumped = {k: v + 0.05 * torch.randn_like(v) for k, v in loop_model.state_dict().items() if "layers.0" in k}
    static.update_weights(bumped)
    plain.update_weights(bumped)
    got, want = await both(params)
    assert [s.token_ids for s in got] == [s.token_ids for s in want]
    assert all(s.weight_version == 1 for s in got)
    static.close()
    plain.close()


async def test_a_model_the_probe_rejects_keeps_the_eager_loop_and_says_why(tiny_model, tiny_tokenizer, monkeypatch,
                                                                          caplog):
    from bridges.adapters.hf import HFEngine, static_decode

    real_update = static_decode.StaticKV.update

    def scrambled(self: Any, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *a: Any, **k: Any) -> Any:
        keys, values = real_update(self, key, value, layer_idx)
        return keys.flip(2), values  # an attention that reads its cache another way
    monkeypatch.setattr(static_decode.StaticKV, "update", scrambled)
    engine = HFEngine(tiny_model, tiny_tokenizer, static_cache=True)
    with caplog.at_level(logging.WARNING, logger="bridges.adapters.hf.engine"):
        [sample] = await engine.generate(tiny_tokenizer.encode("probe"), SamplingParams(max_tokens=5, seed=1))
    assert engine._static.verified is False and len(sample.token_ids) == 5
    assert "decodes with the eager loop: its fixed-shape decode differs" in caplog.text
    engine.close()


async def test_a_lora_policy_is_sampled_through_merged_plain_weights(tiny_path, tiny_tokenizer):
    """The engine's copy of a LoRA policy is the plain base model: each push merges W = base + s * B @ A in
    place (so the fixed-shape path's buffers and graphs stay valid), adapter k+1 replaces adapter k, and the
    samples are the peft model's."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from bridges.adapters.hf import HFEngine

    policy = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_path),
                            LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])).eval()
    plain = AutoModelForCausalLM.from_pretrained(tiny_path).eval()
    base_q = plain.model.layers[0].self_attn.q_proj.weight.detach().clone()
    engine = HFEngine(plain, tiny_tokenizer, static_cache=True)
    prompt, params = tiny_tokenizer.encode("merge me"), SamplingParams(max_tokens=12, temperature=0.0)
    trained = {n: p for n, p in policy.named_parameters() if "lora_" in n}
    for round_ in range(2):
        with torch.no_grad():
            for tensor in trained.values():
                tensor.copy_(torch.randn_like(tensor) * 0.3)
        await engine.aupdate_weights({n: p.detach() for n, p in trained.items()}, policy=policy)
        layer = policy.base_model.model.model.layers[0].self_attn.q_proj
        want = base_q + 2.0 * (layer.lora_B["default"].weight @ layer.lora_A["default"].weight)
        torch.testing.assert_close(plain.model.layers[0].self_attn.q_proj.weight, want)  # not cumulative
        [sample] = await engine.generate(prompt, params)
        reference = HFEngine(policy, tiny_tokenizer)
        [expected] = await reference.generate(prompt, params)
        reference.close()
        assert sample.token_ids == expected.token_ids, round_
        assert sample.logprobs == pytest.approx(expected.logprobs, abs=1e-4)
    assert not any("lora_" in name for name, _ in plain.named_parameters()) and engine.weight_version == 2
    engine.close()


@pytest.mark.parametrize("length", [1, 5])
def test_grouped_heads_attend_the_cache_as_stored_and_give_sdpas_result(length: int):
    """The fixed-shape decode reads 2 key/value heads for 14 query heads (Qwen2.5-0.5B's ratio) without
    repeating them; the result is transformers' sdpa with ``repeat_kv`` (fp32, 1e-6), boolean mask or additive."""
    from types import SimpleNamespace

    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from bridges.adapters.hf.grouped_attention import grouped_sdpa

    gen = torch.Generator().manual_seed(0)
    query = torch.randn(3, 14, length, 16, generator=gen)
    key, value = torch.randn(3, 2, 40, 16, generator=gen), torch.randn(3, 2, 40, 16, generator=gen)
    allowed = torch.rand(3, 1, length, 40, generator=gen) > 0.3
    allowed[..., 0] = True
    module = SimpleNamespace(num_key_value_groups=7, is_causal=True, training=False)
    for mask in (allowed, torch.zeros(allowed.shape).masked_fill_(~allowed, torch.finfo(torch.float32).min)):
        want, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.25)
        got, _ = grouped_sdpa(module, query, key, value, mask, scaling=0.25)
        assert got.shape == want.shape == (3, length, 14, 16)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_the_model_attends_grouped_only_inside_the_decode(tiny_model, tiny_tokenizer):
    from bridges.adapters.hf.grouped_attention import NAME, applies

    assert applies(tiny_model)  # 4 query heads over 2 key/value heads
    seen: list[str] = []
    hook = tiny_model.model.layers[0].self_attn.register_forward_pre_hook(
        lambda module, args: seen.append(module.config._attn_implementation))
    try:
        decoder(tiny_model, tiny_tokenizer).generate(make_rows(tiny_tokenizer, 2, SamplingParams(max_tokens=3)))
    finally:
        hook.remove()
    assert seen and set(seen) == {NAME} and tiny_model.config._attn_implementation == "sdpa"


def test_a_temperature_too_small_to_invert_is_greedy(tiny_model, tiny_tokenizer):
    """2.2e-309 (a subnormal the fuzzer sends) once became an infinite inverse temperature and NaN logprobs."""
    tiny, greedy = SamplingParams(max_tokens=6, temperature=2.225073858507203e-309), SamplingParams(max_tokens=6,
                                                                                                      temperature=0.0)
    got = loop(tiny_model, tiny_tokenizer, make_rows(tiny_tokenizer, 3, tiny))
    want = loop(tiny_model, tiny_tokenizer, make_rows(tiny_tokenizer, 3, greedy))
    assert_same(got, want)
    assert all(all(math.isfinite(x) for x in r.logprobs) for r in got)
