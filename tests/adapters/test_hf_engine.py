"""HFEngine against the real tiny model: logprob correctness, batching, sampling controls, weights."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from bridges.adapters.hf import HFEngine, InvalidRequestError
from bridges.envs.types import SamplingParams
from bridges.runtime.errors import BridgesError, EngineError, PromptTooLongError


def recompute_logprobs(
    model: Any, prompt: list[int], completion: list[int], temperature: float
) -> torch.Tensor:
    """The trainer's view: one full forward pass over prompt + completion, no cache, no padding."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0].float()
    logits = logits[len(prompt) - 1 : len(prompt) - 1 + len(completion)]
    if temperature > 0:
        logits = logits / temperature
    return torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(completion).unsqueeze(1)).squeeze(1)


def encode(tokenizer: Any, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def private_model(tiny_path: Any) -> Any:
    """A copy of the tiny model a test may change without affecting the shared one."""
    return AutoModelForCausalLM.from_pretrained(tiny_path).eval()


def boost_logit(model: Any, token_id: int, amount: float) -> None:
    """Make ``token_id`` more likely at every position (a forward hook on the LM head)."""
    bias = torch.zeros(model.config.vocab_size)
    bias[token_id] = amount
    model.get_output_embeddings().register_forward_hook(lambda _m, _i, out: out + bias)


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9), (0.0, 1.0)])
async def test_logprobs_equal_a_full_forward_pass(hf_engine, tiny_model, tiny_tokenizer, temperature, top_p):
    # Prompts of different lengths share the batch, so padding, the KV cache and compaction are all
    # on the path; top_p < 1 must not change the reported (temperature-scaled, full) distribution.
    prompts = [encode(tiny_tokenizer, t) for t in ("Hi", "The quick brown fox", "<|im_start|>user\n2+2?")]
    params = SamplingParams(max_tokens=24, temperature=temperature, top_p=top_p, seed=3)
    results = await asyncio.gather(*(hf_engine.generate(p, params, n=3) for p in prompts))
    assert hf_engine.stats.batches == 1
    checked = 0
    for prompt, samples in zip(prompts, results, strict=True):
        for sample in samples:
            assert len(sample.logprobs) == len(sample.token_ids) > 0
            expected = recompute_logprobs(tiny_model, prompt, sample.token_ids, temperature)
            torch.testing.assert_close(torch.tensor(sample.logprobs), expected, atol=1e-4, rtol=0)
            checked += len(sample.token_ids)
    assert checked >= 9


async def test_n_samples_are_rows_of_one_batch(hf_engine, tiny_tokenizer):
    samples = await hf_engine.generate(encode(tiny_tokenizer, "abc"), SamplingParams(max_tokens=12), n=8)
    assert len(samples) == 8
    assert len({tuple(s.token_ids) for s in samples}) > 1  # sampled independently
    assert (hf_engine.stats.batches, hf_engine.stats.rows, hf_engine.stats.requests) == (1, 8, 1)
    assert hf_engine.stats.tokens == sum(len(s.token_ids) for s in samples)


async def test_seeded_request_is_reproducible_whatever_shares_its_batch(hf_engine, tiny_tokenizer):
    prompt = encode(tiny_tokenizer, "seeded prompt")
    params = SamplingParams(max_tokens=16, seed=1234)
    alone = await hf_engine.generate(prompt, params, n=2)
    others = [
        hf_engine.generate(encode(tiny_tokenizer, "x" * k), SamplingParams(max_tokens=30)) for k in (1, 40)
    ]
    batched, *_ = await asyncio.gather(hf_engine.generate(prompt, params, n=2), *others)
    assert [s.token_ids for s in alone] == [s.token_ids for s in batched]
    for a, b in zip(alone, batched, strict=True):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=0)
    assert alone[0].token_ids != alone[1].token_ids  # each sample index has its own stream
    other_seed = await hf_engine.generate(prompt, SamplingParams(max_tokens=16, seed=1235))
    assert other_seed[0].token_ids != alone[0].token_ids


async def test_greedy_is_the_same_alone_and_left_padded_in_a_batch(hf_engine, tiny_tokenizer):
    short = encode(tiny_tokenizer, "Hi!")
    greedy = SamplingParams(max_tokens=20, temperature=0.0)
    alone = (await hf_engine.generate(short, greedy))[0]
    longer = [encode(tiny_tokenizer, "A much longer prompt " * k) for k in (2, 5)]
    results = await asyncio.gather(*(hf_engine.generate(p, greedy) for p in [*longer, short]))
    padded = results[-1][0]
    assert hf_engine.stats.max_batch_rows == 3
    assert padded.token_ids == alone.token_ids
    torch.testing.assert_close(torch.tensor(padded.logprobs), torch.tensor(alone.logprobs), atol=1e-4, rtol=0)


async def test_concurrent_calls_share_one_batch_and_big_ones_are_split(tiny_model, tiny_tokenizer):
    engine = HFEngine(tiny_model, tiny_tokenizer, max_batch_size=4)
    params = SamplingParams(max_tokens=3)
    # wrapped in wait_for, as the client bounds every engine call: each call then starts in a task
    # of its own, one tick later, and must still land in the same batch
    calls = [asyncio.wait_for(engine.generate(encode(tiny_tokenizer, str(i)), params), 30) for i in range(3)]
    results = await asyncio.gather(*calls)
    assert [len(r) for r in results] == [1, 1, 1]
    assert (engine.stats.batches, engine.stats.rows) == (1, 3)
    samples = await engine.generate(encode(tiny_tokenizer, "split me"), params, n=10)
    assert len(samples) == 10
    assert (engine.stats.batches, engine.stats.rows, engine.stats.max_batch_rows) == (4, 13, 4)


async def test_max_tokens_ends_with_length_and_is_clipped_to_the_context(tiny_model, tiny_tokenizer):
    prompt = encode(tiny_tokenizer, "count")
    engine = HFEngine(tiny_model, tiny_tokenizer, max_model_len=len(prompt) + 3)
    no_eos = SamplingParams(max_tokens=7, temperature=0.0)
    assert engine.max_model_len == len(prompt) + 3
    [clipped] = await engine.generate(prompt, no_eos)
    assert (len(clipped.token_ids), clipped.finish_reason) == (3, "length")
    wide = HFEngine(tiny_model, tiny_tokenizer)
    assert wide.max_model_len == tiny_model.config.max_position_embeddings == 4096
    [full] = await wide.generate(prompt, no_eos)
    assert (len(full.token_ids), full.finish_reason, full.stop_str) == (7, "length", None)
    assert 2 not in full.token_ids  # greedy from this prompt never picks eos, so "length" is the cause


async def test_stop_string_ends_the_sample_where_it_first_completes(hf_engine, tiny_tokenizer):
    prompt = encode(tiny_tokenizer, "stop here")
    free = (await hf_engine.generate(prompt, SamplingParams(max_tokens=40, seed=7, stop_token_ids=[])))[0]
    text = tiny_tokenizer.decode(free.token_ids)
    stop = text[6:8]
    ends = [k for k in range(1, len(free.token_ids) + 1) if stop in tiny_tokenizer.decode(free.token_ids[:k])]
    stopped = (await hf_engine.generate(prompt, SamplingParams(max_tokens=40, seed=7, stop=["@@@@", stop])))[
        0
    ]
    assert (stopped.finish_reason, stopped.stop_str) == ("stop", stop)
    assert stopped.token_ids == free.token_ids[: ends[0]]  # every sampled id kept, up to the stop
    # the last id completes the stop string (which may end inside that id's text)
    assert stop in tiny_tokenizer.decode(stopped.token_ids)
    assert stop not in tiny_tokenizer.decode(stopped.token_ids[:-1])


async def test_eos_is_kept_with_its_logprob_and_stop_token_ids_stop(tiny_path, tiny_tokenizer):
    model = private_model(tiny_path)
    eos = tiny_tokenizer.eos_token_id
    boost_logit(model, eos, 6.0)
    engine = HFEngine(model, tiny_tokenizer)
    prompt = encode(tiny_tokenizer, "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n")
    samples = await engine.generate(prompt, SamplingParams(max_tokens=40, seed=0), n=16)
    stopped = [s for s in samples if s.finish_reason == "stop"]
    assert stopped, "the boosted eos was never sampled"
    for sample in samples:
        assert eos not in sample.token_ids[:-1]  # generation ends at the first eos
        if sample.finish_reason == "stop":
            assert sample.token_ids[-1] == eos and sample.stop_str is None
        else:
            assert (sample.finish_reason, len(sample.token_ids)) == ("length", 40)
        expected = recompute_logprobs(model, prompt, sample.token_ids, 1.0)
        torch.testing.assert_close(torch.tensor(sample.logprobs), expected, atol=1e-4, rtol=0)
    # a request's own stop_token_ids end generation the same way
    boost_logit(model, encode(tiny_tokenizer, "Z")[0], 50.0)
    [custom] = await engine.generate(
        prompt, SamplingParams(max_tokens=5, stop_token_ids=[encode(tiny_tokenizer, "Z")[0]])
    )
    assert (custom.token_ids, custom.finish_reason) == (encode(tiny_tokenizer, "Z"), "stop")
    assert custom.logprobs[0] == pytest.approx(0.0, abs=1e-4)


async def test_top_k_1_and_tiny_top_p_pick_the_argmax_but_report_the_full_distribution(
    hf_engine, tiny_tokenizer
):
    prompt = encode(tiny_tokenizer, "top")
    greedy = (await hf_engine.generate(prompt, SamplingParams(max_tokens=10, temperature=0.0)))[0]
    top_k = (await hf_engine.generate(prompt, SamplingParams(max_tokens=10, temperature=1.0, top_k=1)))[0]
    top_p = (await hf_engine.generate(prompt, SamplingParams(max_tokens=10, temperature=1.0, top_p=1e-6)))[0]
    assert top_k.token_ids == top_p.token_ids == greedy.token_ids
    assert max(top_k.logprobs) < -0.5  # not renormalised to probability 1 over the kept id


async def test_weight_updates_bump_the_version_and_never_split_a_batch(tiny_path, tiny_tokenizer):
    model = private_model(tiny_path)
    old_model = private_model(tiny_path)
    engine = HFEngine(model, tiny_tokenizer)
    prompt = encode(tiny_tokenizer, "weights")
    params = SamplingParams(max_tokens=300, seed=5, stop_token_ids=[])
    torch.manual_seed(0)
    new_state = {k: v + 0.05 * torch.randn_like(v) for k, v in model.state_dict().items() if "mlp" in k}

    running = asyncio.ensure_future(engine.generate(prompt, params))
    for _ in range(10_000):  # wait (at most ~10 s) until the batch is running and holds the weights
        if engine.weight_lock.locked():
            break
        await asyncio.sleep(0.001)
    assert engine.weight_lock.locked() and not running.done()
    assert await engine.aupdate_weights(new_state) == 1  # waits for the running batch
    [during] = await running
    assert during.weight_version == 0
    expected_old = recompute_logprobs(old_model, prompt, during.token_ids, 1.0)
    torch.testing.assert_close(torch.tensor(during.logprobs), expected_old, atol=1e-4, rtol=0)

    [after] = await engine.generate(prompt, SamplingParams(max_tokens=20, seed=5))
    assert after.weight_version == engine.weight_version == 1
    torch.testing.assert_close(
        torch.tensor(after.logprobs),
        recompute_logprobs(model, prompt, after.token_ids, 1.0),
        atol=1e-4,
        rtol=0,
    )
    assert not torch.allclose(
        torch.tensor(after.logprobs), recompute_logprobs(old_model, prompt, after.token_ids, 1.0)
    )

    assert engine.mark_weights_updated() == 2
    assert (await engine.generate(prompt, SamplingParams(max_tokens=2)))[0].weight_version == 2
    with pytest.raises(InvalidRequestError, match="not_a_weight"):
        engine.update_weights({"not_a_weight": torch.zeros(1)})
    with pytest.raises(InvalidRequestError, match="shape"):
        engine.update_weights({"lm_head.weight": torch.zeros(3, 3)})
    assert engine.weight_version == 2


async def test_bad_prompts_raise_one_clear_error(hf_engine, tiny_tokenizer):
    limit = hf_engine.max_model_len
    with pytest.raises(PromptTooLongError, match=rf"{limit} tokens.*\(max_model_len\) is {limit}"):
        await hf_engine.generate([5] * limit, SamplingParams())
    with pytest.raises(BridgesError, match="empty"):
        await hf_engine.generate([], SamplingParams())
    with pytest.raises(InvalidRequestError, match="vocabulary"):
        await hf_engine.generate([5, 10_000], SamplingParams())
    with pytest.raises(InvalidRequestError, match="top_p"):
        await hf_engine.generate([5], SamplingParams(top_p=0.0))
    assert hf_engine.stats.batches == 0


async def test_a_cancelled_request_does_not_disturb_the_others(hf_engine, tiny_tokenizer):
    params = SamplingParams(max_tokens=5, seed=1)
    doomed = asyncio.ensure_future(hf_engine.generate(encode(tiny_tokenizer, "a"), params))
    kept = asyncio.ensure_future(hf_engine.generate(encode(tiny_tokenizer, "b"), params))
    doomed.cancel()
    [sample] = await kept
    assert len(sample.token_ids) == 5
    assert hf_engine.stats.rows == 1  # the cancelled request was never computed


async def test_a_request_given_up_mid_batch_stops_decoding_at_its_next_step(hf_engine, tiny_tokenizer):
    """Before, a timed-out request's row decoded to max_tokens for nobody, holding its batch that long.
    Greedy from "count" never picks eos (above), so the kept row's 300 tokens are all "length"."""
    params = SamplingParams(max_tokens=300, temperature=0.0)
    doomed = asyncio.ensure_future(hf_engine.generate(encode(tiny_tokenizer, "count"), replace(params, max_tokens=1000)))
    kept = asyncio.ensure_future(hf_engine.generate(encode(tiny_tokenizer, "count"), params))
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(asyncio.shield(doomed), 0.05)  # the caller's own timeout
    doomed.cancel()
    [sample] = await kept
    assert (len(sample.token_ids), sample.finish_reason) == (300, "length")
    assert hf_engine.stats.rows == 2 and hf_engine.stats.tokens < 300 + 500, hf_engine.stats.tokens  # not 1,300


def test_engine_serves_several_event_loops_in_turn(hf_engine, tiny_tokenizer):
    async def burst() -> list[list[Any]]:
        calls = [hf_engine.generate(encode(tiny_tokenizer, w), SamplingParams(max_tokens=4)) for w in "xyz"]
        return await asyncio.gather(*calls)

    first = asyncio.run(burst())
    second = asyncio.run(burst())
    assert [len(r) for r in first + second] == [1] * 6
    assert (hf_engine.stats.batches, hf_engine.stats.rows) == (2, 6)


async def test_close_refuses_new_requests(tiny_model, tiny_tokenizer):
    engine = HFEngine(tiny_model, tiny_tokenizer)
    await engine.generate([5, 6], SamplingParams(max_tokens=1))
    await engine.aclose()
    with pytest.raises(EngineError, match="closed"):
        await engine.generate([5, 6], SamplingParams(max_tokens=1))


def test_from_pretrained_tiny(tiny_path):
    engine = HFEngine.from_pretrained("tiny")
    assert (engine.name, engine.max_model_len, engine.weight_version) == ("tiny", 4096, 0)
    assert next(engine.model.parameters()).dtype == torch.float32
    assert engine.eos_token_ids == {engine.tokenizer.eos_token_id}
    local = HFEngine.from_pretrained(str(tiny_path), max_batch_size=8, name="local")
    assert (local.name, local.max_batch_size) == ("local", 8)


async def test_the_decode_loop_uses_the_installed_transformers_name_for_the_kv_cache(
    hf_engine, tiny_tokenizer, caplog: pytest.LogCaptureFixture
):
    """transformers renamed ``past_key_values`` to ``cache``; the old name warns on every forward (a
    FutureWarning per decoded token in a run). Whatever version is installed, decoding warns nothing."""
    import dataclasses
    import warnings

    from transformers.modeling_outputs import CausalLMOutputWithPast

    from bridges.adapters.hf.decode import cache_keyword

    assert cache_keyword() in {f.name for f in dataclasses.fields(CausalLMOutputWithPast)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        samples = await hf_engine.generate(encode(tiny_tokenizer, "hello there"), SamplingParams(max_tokens=6), n=3)
    assert all(len(s.token_ids) >= 1 for s in samples)
    assert not [r for r in caplog.records if "deprecated" in r.getMessage()]
