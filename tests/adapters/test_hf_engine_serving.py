"""HFEngine as a server: what rollouts and the client rely on beyond one well-behaved batch.

Requests that arrive while a batch runs, rows that finish at different steps, the sampled
distribution itself, timeouts, a failing model, and two event loops at once. Companion to
test_hf_engine.py (same tiny model, same reference: one full forward pass, as the trainer does it).
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from bridges.adapters.hf import HFEngine
from bridges.envs.types import SamplingParams
from bridges.runtime.errors import EngineError

BOOSTS = {"A": 4.0, "B": 3.0, "C": 2.0}  # a peaked first-token distribution whose shape depends on T


def encode(tokenizer: Any, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def next_token_logits(model: Any, prompt: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([prompt])).logits[0, -1].float()


def reference_logprobs(
    model: Any, prompt: list[int], completion: list[int], temperature: float
) -> torch.Tensor:
    """log_softmax(logits / T) of each sampled id from one uncached, unpadded forward pass."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0].float()
    logits = logits[len(prompt) - 1 : len(prompt) - 1 + len(completion)] / (temperature or 1.0)
    return torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(completion).unsqueeze(1)).squeeze(1)


@pytest.fixture(scope="module")
def peaked_model(tiny_path: Any, tiny_tokenizer: Any) -> Any:
    """A private tiny model that never emits eos and strongly prefers A > B > C (a bias on the LM head)."""
    model = AutoModelForCausalLM.from_pretrained(tiny_path).eval()
    bias = torch.zeros(model.config.vocab_size)
    bias[tiny_tokenizer.eos_token_id] = -1e4
    for text, amount in BOOSTS.items():
        bias[encode(tiny_tokenizer, text)[0]] = amount
    model.get_output_embeddings().register_forward_hook(lambda _m, _i, out: out + bias)
    return model


async def wait_until_running(engine: HFEngine, task: asyncio.Future[Any]) -> None:
    async with asyncio.timeout(30):
        while not engine.weight_lock.locked():  # a batch holds the lock from start to end
            assert not task.done(), "the long request finished before the test could observe it"
            await asyncio.sleep(0.001)


async def test_requests_arriving_while_a_batch_runs_share_the_next_batch(peaked_model, tiny_tokenizer):
    engine = HFEngine(peaked_model, tiny_tokenizer)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.002)
            ticks += 1

    ticking = asyncio.ensure_future(ticker())
    long = asyncio.ensure_future(
        engine.generate(encode(tiny_tokenizer, "go"), SamplingParams(max_tokens=200))
    )
    await wait_until_running(engine, long)
    late = []
    for word in ("one", "two", "three"):  # three separate ticks, all during the long batch
        late.append(
            asyncio.ensure_future(engine.generate(encode(tiny_tokenizer, word), SamplingParams(max_tokens=5)))
        )
        await asyncio.sleep(0.005)
    assert not long.done()
    ticks_before = ticks
    [long_sample] = await long
    assert ticks > ticks_before  # the event loop kept running while the batch computed
    results = await asyncio.gather(*late)
    ticking.cancel()
    assert (long_sample.finish_reason, len(long_sample.token_ids)) == ("length", 200)
    assert [len(r[0].token_ids) for r in results] == [5, 5, 5]
    assert (engine.stats.batches, engine.stats.rows, engine.stats.max_batch_rows) == (2, 4, 3)


async def test_rows_that_finish_at_different_steps_keep_exact_logprobs(hf_engine, tiny_model, tiny_tokenizer):
    # One batch where rows drop out at steps 1, 2, 5, 9, 17 and 33: the KV cache is compacted several
    # times, and every surviving row must still see exactly its own history.
    cases = [(1, 0.0), (2, 1.3), (5, 0.7), (9, 1.0), (17, 0.0), (33, 0.7)]
    prompts = [encode(tiny_tokenizer, "x" * (3 * i + 1)) for i in range(len(cases))]
    calls = [
        hf_engine.generate(p, SamplingParams(max_tokens=m, temperature=t, seed=i, stop_token_ids=[]))
        for i, (p, (m, t)) in enumerate(zip(prompts, cases, strict=True))
    ]
    results = await asyncio.gather(*calls)
    assert (hf_engine.stats.batches, hf_engine.stats.rows) == (1, len(cases))
    for prompt, (max_tokens, temperature), [sample] in zip(prompts, cases, results, strict=True):
        if sample.finish_reason == "length":
            assert len(sample.token_ids) == max_tokens
        else:  # sampled eos early
            assert sample.token_ids[-1] == tiny_tokenizer.eos_token_id and len(sample.token_ids) <= max_tokens
        expected = reference_logprobs(tiny_model, prompt, sample.token_ids, temperature)
        torch.testing.assert_close(torch.tensor(sample.logprobs), expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("temperature", [0.7, 1.0])
async def test_draws_follow_the_temperature_scaled_distribution(peaked_model, tiny_tokenizer, temperature):
    engine = HFEngine(peaked_model, tiny_tokenizer, max_batch_size=2048)
    prompt = encode(tiny_tokenizer, "Q:")
    probs = torch.softmax(next_token_logits(peaked_model, prompt) / temperature, dim=-1)
    ids = {text: encode(tiny_tokenizer, text)[0] for text in BOOSTS}
    draws = 2000
    samples = await engine.generate(
        prompt, SamplingParams(max_tokens=1, temperature=temperature, seed=11), n=draws
    )
    counts = Counter(s.token_ids[0] for s in samples)
    for text, token in ids.items():  # sd of each frequency <= 0.011, so 0.04 is > 3.5 sd
        assert counts[token] / draws == pytest.approx(probs[token].item(), abs=0.04), text
    rest = 1 - sum(probs[t].item() for t in ids.values())
    assert (draws - sum(counts[t] for t in ids.values())) / draws == pytest.approx(rest, abs=0.04)
    logprob_of = {s.token_ids[0]: s.logprobs[0] for s in samples}
    for token, logprob in logprob_of.items():
        assert logprob == pytest.approx(probs[token].log().item(), abs=1e-4)


async def test_top_k_and_top_p_restrict_the_draws_but_not_the_reported_logprobs(peaked_model, tiny_tokenizer):
    engine = HFEngine(peaked_model, tiny_tokenizer, max_batch_size=1024)
    prompt = encode(tiny_tokenizer, "Q:")
    probs = torch.softmax(next_token_logits(peaked_model, prompt) / 0.7, dim=-1)
    order = probs.argsort(descending=True).tolist()
    mass_before = torch.cumsum(probs[order], 0) - probs[order]
    nucleus = {order[i] for i in range(len(order)) if mass_before[i] <= 0.7}
    assert 1 < len(nucleus) < 5  # the model is peaked enough for top_p=0.7 to cut something
    top_k = await engine.generate(
        prompt, SamplingParams(max_tokens=1, temperature=0.7, top_k=2, seed=1), n=600
    )
    top_p = await engine.generate(
        prompt, SamplingParams(max_tokens=1, temperature=0.7, top_p=0.7, seed=2), n=600
    )
    k_counts = Counter(s.token_ids[0] for s in top_k)
    assert set(k_counts) == set(order[:2])
    share = k_counts[order[0]] / len(top_k)  # renormalised over the two kept ids
    assert share == pytest.approx((probs[order[0]] / probs[order[:2]].sum()).item(), abs=0.06)
    assert {s.token_ids[0] for s in top_p} == nucleus
    for sample in top_k + top_p:  # full temperature-scaled distribution, not the truncated one
        assert sample.logprobs[0] == pytest.approx(probs[sample.token_ids[0]].log().item(), abs=1e-4)


async def test_a_timed_out_request_leaves_the_engine_serving(peaked_model, tiny_tokenizer):
    engine = HFEngine(peaked_model, tiny_tokenizer)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):  # what EngineClient wraps every engine call in
            await engine.generate(encode(tiny_tokenizer, "slow"), SamplingParams(max_tokens=600))
    async with asyncio.timeout(60):
        [sample] = await engine.generate(encode(tiny_tokenizer, "next"), SamplingParams(max_tokens=4, seed=0))
    assert (len(sample.token_ids), sample.finish_reason) == (4, "length")
    expected = reference_logprobs(peaked_model, encode(tiny_tokenizer, "next"), sample.token_ids, 1.0)
    torch.testing.assert_close(torch.tensor(sample.logprobs), expected, atol=1e-4, rtol=0)


async def test_a_failing_batch_fails_its_requests_and_the_engine_recovers(tiny_path, tiny_tokenizer):
    model = AutoModelForCausalLM.from_pretrained(tiny_path).eval()
    engine = HFEngine(model, tiny_tokenizer)

    def explode(*_: Any) -> None:
        raise RuntimeError("device lost")

    hook = model.get_input_embeddings().register_forward_pre_hook(explode)
    calls = [engine.generate(encode(tiny_tokenizer, w), SamplingParams(max_tokens=3)) for w in ("ab", "cd")]
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    for outcome in outcomes:
        assert isinstance(outcome, EngineError)
        assert "RuntimeError: device lost" in str(outcome)
    hook.remove()
    [sample] = await engine.generate(encode(tiny_tokenizer, "ab"), SamplingParams(max_tokens=3))
    assert len(sample.token_ids) == 3 and sample.weight_version == 0


def test_two_event_loops_at_once_take_turns_on_one_engine(hf_engine, tiny_tokenizer):
    greedy = SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=[])
    words = ["alpha", "beta", "gamma"]
    reference = asyncio.run(hf_engine.generate(encode(tiny_tokenizer, "alpha"), greedy))[0]
    outcomes: dict[int, Any] = {}

    def worker(slot: int) -> None:
        async def burst() -> list[Any]:
            return await asyncio.gather(
                *(hf_engine.generate(encode(tiny_tokenizer, w), greedy) for w in words)
            )

        try:
            outcomes[slot] = asyncio.run(burst())
        except BaseException as exc:  # reported by the assertion below
            outcomes[slot] = exc

    threads = [threading.Thread(target=worker, args=(slot,)) for slot in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    for slot in range(2):
        results = outcomes[slot]
        assert isinstance(results, list), results
        assert results[0][0].token_ids == reference.token_ids
        assert all(len(r[0].token_ids) == 12 or r[0].finish_reason == "stop" for r in results)
    assert hf_engine.stats.rows == 1 + 2 * len(words)
