"""PagedEngine (transformers' continuous batching) against HFEngine and the trainer's own logprobs.

Each test builds its engine over a private copy of the tiny model: the manager switches the module's
attention to the paged kernel while it runs, which the shared model must never see.
"""

from __future__ import annotations

import asyncio
import math
import threading
from dataclasses import replace
from typing import Any

import pytest
import torch
from test_hf_engine import encode, private_model, recompute_logprobs

from bridges.adapters.hf import HFEngine, PagedEngine
from bridges.envs.types import SamplingParams
from bridges.runtime.errors import EngineError

PROMPTS = ("Hi", "The quick brown fox", "<|im_start|>user\n2+2?", "count to ten", "abc abc abc")


@pytest.fixture
def paged(tiny_path: Any, tiny_tokenizer: Any) -> Any:
    engine = PagedEngine(private_model(tiny_path), tiny_tokenizer)
    yield engine
    engine.close()


async def test_greedy_gives_the_hf_engines_ids_and_logprobs(paged, tiny_model, tiny_tokenizer):
    hf = HFEngine(tiny_model, tiny_tokenizer)
    prompts = [encode(tiny_tokenizer, t) for t in PROMPTS]
    params = SamplingParams(max_tokens=24, temperature=0.0)
    ours = await asyncio.gather(*(paged.generate(p, params) for p in prompts))
    theirs = await asyncio.gather(*(hf.generate(p, params) for p in prompts))
    for (a,), (b,) in zip(ours, theirs, strict=True):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=0)
    assert paged.stats.rows == len(PROMPTS) and paged.stats.tokens == sum(len(s.token_ids) for (s,) in ours)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
async def test_sampled_logprobs_are_the_trainers(paged, tiny_model, tiny_tokenizer, temperature):
    """What the mismatch metric compares: the engine's logprob of each sampled id against one full
    forward pass over prompt + completion at the same temperature."""
    prompts = [encode(tiny_tokenizer, t) for t in PROMPTS[:3]]
    params = SamplingParams(max_tokens=20, temperature=temperature)
    results = await asyncio.gather(*(paged.generate(p, params, n=3) for p in prompts))
    checked = 0
    for prompt, samples in zip(prompts, results, strict=True):
        assert len(samples) == 3
        for sample in samples:
            expected = recompute_logprobs(tiny_model, prompt, sample.token_ids, temperature)
            torch.testing.assert_close(torch.tensor(sample.logprobs), expected, atol=1e-4, rtol=0)
            checked += len(sample.token_ids)
    assert checked >= 9


async def test_top_k_and_top_p_report_the_truncated_distribution_they_drew_from(
    paged, tiny_model, tiny_tokenizer
):
    prompt = encode(tiny_tokenizer, "Hi")
    params = SamplingParams(max_tokens=12, temperature=1.0, top_k=1)
    [sample] = await paged.generate(prompt, params)
    assert sample.logprobs == pytest.approx([0.0] * len(sample.token_ids), abs=1e-6)  # one id left: p = 1
    [nucleus] = await paged.generate(prompt, replace(params, top_k=-1, top_p=0.9))
    full = recompute_logprobs(tiny_model, prompt, nucleus.token_ids, 1.0)
    lifted = torch.tensor(nucleus.logprobs) - full  # log(1 / the mass top-p kept), > 0 and at most log(1/0.9)
    assert bool((lifted > 1e-4).all()) and bool((lifted <= math.log(1 / 0.9) + 1e-4).all()), lifted


async def test_stop_strings_cut_the_sample_where_the_hf_engine_stops(paged, tiny_model, tiny_tokenizer):
    hf = HFEngine(tiny_model, tiny_tokenizer)
    prompt = encode(tiny_tokenizer, "stop here")
    greedy = SamplingParams(max_tokens=40, temperature=0.0, stop_token_ids=[])
    [free] = await paged.generate(prompt, greedy)
    stop = tiny_tokenizer.decode(free.token_ids)[6:8]
    stopped = replace(greedy, stop=["@@@@", stop])
    [ours], [theirs] = await paged.generate(prompt, stopped), await hf.generate(prompt, stopped)
    assert (ours.finish_reason, ours.stop_str) == ("stop", stop) == (theirs.finish_reason, theirs.stop_str)
    assert ours.token_ids == theirs.token_ids and len(ours.logprobs) == len(ours.token_ids)


async def test_warper_sets_take_turns_and_all_requests_are_served(paged, tiny_tokenizer):
    """Greedy, sampling and nucleus requests at once: each set runs when the other's rows are done."""
    prompt = encode(tiny_tokenizer, "count")
    kinds = [
        SamplingParams(max_tokens=8, temperature=t, top_p=p) for t, p in ((0.0, 1.0), (1.0, 1.0), (0.8, 0.9))
    ]
    results = await asyncio.gather(*(paged.generate(prompt, kinds[i % 3]) for i in range(9)))
    assert [len(r) for r in results] == [1] * 9
    greedy = [r[0].token_ids for i, r in enumerate(results) if i % 3 == 0]
    assert greedy[0] == greedy[1] == greedy[2]


async def test_a_weight_update_waits_for_running_rows_and_stamps_new_ones(tiny_path, tiny_tokenizer):
    model = private_model(tiny_path)
    engine = PagedEngine(model, tiny_tokenizer)
    long = asyncio.ensure_future(
        engine.generate(
            encode(tiny_tokenizer, "a"), SamplingParams(max_tokens=200, temperature=0.0, stop_token_ids=[])
        )
    )
    while not engine._running:  # the row is in the running batch
        await asyncio.sleep(0.005)
    zeros = {k: torch.zeros_like(v) for k, v in model.state_dict().items() if "lm_head" in k or "embed" in k}
    update = asyncio.ensure_future(engine.aupdate_weights(zeros))
    [old] = await long
    assert await update == 1
    [new] = await engine.generate(encode(tiny_tokenizer, "a"), SamplingParams(max_tokens=4))
    assert (old.weight_version, new.weight_version) == (0, 1)
    assert old.logprobs[-1] != pytest.approx(
        -math.log(len(tiny_tokenizer)), abs=1e-3
    )  # drawn from old weights
    assert new.logprobs == pytest.approx([-math.log(len(tiny_tokenizer))] * len(new.logprobs), rel=1e-3)
    engine.close()


async def test_a_cancelled_request_leaves_the_batch_and_the_others_finish(paged, tiny_tokenizer):
    doomed = asyncio.ensure_future(
        paged.generate(
            encode(tiny_tokenizer, "a"), SamplingParams(max_tokens=2000, temperature=0.0, stop_token_ids=[])
        )
    )
    kept = asyncio.ensure_future(
        paged.generate(
            encode(tiny_tokenizer, "b"), SamplingParams(max_tokens=30, temperature=0.0, stop_token_ids=[])
        )
    )
    while len(paged._running) < 2:
        await asyncio.sleep(0.005)
    doomed.cancel()
    [sample] = await kept
    assert len(sample.token_ids) == 30
    [after] = await paged.generate(encode(tiny_tokenizer, "c"), SamplingParams(max_tokens=3))
    assert len(after.token_ids) <= 3 and not paged._running


async def test_top_logprobs_run_through_the_hf_decode_loop_and_paging_resumes(paged, tiny_tokenizer):
    prompt = encode(tiny_tokenizer, "Hi")
    greedy = SamplingParams(max_tokens=10, temperature=0.0)
    [before] = await paged.generate(prompt, greedy)
    [alternatives] = await paged.generate(prompt, replace(greedy, top_logprobs=2))
    [after] = await paged.generate(prompt, greedy)
    assert alternatives.top_logprobs is not None and len(alternatives.top_logprobs) == len(
        alternatives.token_ids
    )
    assert before.token_ids == alternatives.token_ids == after.token_ids
    assert paged.model.config._attn_implementation.startswith("paged|")  # the manager runs again


def test_the_engine_serves_several_event_loops_in_turn(paged, tiny_tokenizer):
    async def burst() -> list[Any]:
        calls = [paged.generate(encode(tiny_tokenizer, w), SamplingParams(max_tokens=4)) for w in "xyz"]
        return await asyncio.gather(*calls)

    assert [len(r) for r in asyncio.run(burst()) + asyncio.run(burst())] == [1] * 6


async def test_close_fails_running_rows_in_one_sentence_and_refuses_new_ones(tiny_path, tiny_tokenizer):
    engine = PagedEngine(private_model(tiny_path), tiny_tokenizer)
    running = asyncio.ensure_future(
        engine.generate(
            encode(tiny_tokenizer, "a"), SamplingParams(max_tokens=5000, temperature=0.0, stop_token_ids=[])
        )
    )
    while not engine._running:
        await asyncio.sleep(0.005)
    await asyncio.to_thread(engine.close)
    with pytest.raises(EngineError, match="stopped before this row finished"):
        await asyncio.wait_for(running, 10)
    with pytest.raises(EngineError, match="closed"):
        await engine.generate([5, 6], SamplingParams(max_tokens=1))
    assert not [t for t in threading.enumerate() if t.name.startswith(f"{engine.name}-results")]
    assert not engine.model.config._attn_implementation.startswith("paged|")


async def test_bad_requests_are_refused_before_any_work(paged):
    from bridges.adapters.hf import InvalidRequestError

    with pytest.raises(InvalidRequestError, match="empty"):
        await paged.generate([], SamplingParams())
    with pytest.raises(InvalidRequestError, match="vocabulary"):
        await paged.generate([10**9], SamplingParams())
    assert paged._manager is None


def test_a_non_positive_cache_is_refused(tiny_path, tiny_tokenizer):
    from bridges.adapters.hf import InvalidRequestError

    with pytest.raises(InvalidRequestError, match="cache_tokens"):
        PagedEngine(private_model(tiny_path), tiny_tokenizer, cache_tokens=0)


def test_a_cache_in_tokens_leaves_each_row_a_part_filled_block():
    from bridges.adapters.hf.paged_manager import blocks_for

    assert blocks_for(6_400, 256, 64) == 25 + 64  # 64 rows of ~100 tokens need 64 blocks, not 25
    assert blocks_for(1, 32, 1) == 2


@pytest.mark.parametrize(
    ("on_gpu", "processes", "installed", "chosen"),
    [(False, 1, {"vllm", "flash_attn"}, "hf"), (True, 1, {"vllm", "flash_attn"}, "vllm"),
     (True, 2, {"vllm", "flash_attn"}, "paged"), (True, 1, {"flash_attn"}, "paged"), (True, 1, set(), "hf")],
)
def test_auto_takes_the_paged_engine_only_where_flash_attention_makes_it_fast(
    on_gpu, processes, installed, chosen, monkeypatch
):
    """Without a flash-attention kernel transformers runs the paged engine as paged|sdpa, eagerly and
    without CUDA graphs: on an H100 that was slower than the hf decode loop, so auto keeps hf there."""
    from bridges.grpo import policy

    monkeypatch.setattr(policy, "_installed", lambda module: module in installed)
    assert policy.auto_engine(on_gpu, processes) == chosen


async def test_a_failed_step_fails_its_rows_in_one_sentence_and_the_next_request_runs(
    tiny_path, tiny_tokenizer
):
    """A NaN distribution kills transformers' generation loop: its rows fail with the reason, and the
    engine starts a fresh manager for the next request instead of queueing on the dead one."""
    model = private_model(tiny_path)
    poison = {"on": True}
    model.get_output_embeddings().register_forward_hook(
        lambda _m, _i, out: out * float("nan") if poison["on"] else out
    )
    engine = PagedEngine(model, tiny_tokenizer)
    with pytest.raises(EngineError, match="probability tensor contains either `inf`, `nan`"):
        await asyncio.wait_for(engine.generate([5, 6, 7], SamplingParams(max_tokens=5)), 30)
    poison["on"] = False
    [sample] = await asyncio.wait_for(engine.generate([5, 6, 7], SamplingParams(max_tokens=5)), 30)
    assert 1 <= len(sample.token_ids) <= 5 and all(math.isfinite(lp) for lp in sample.logprobs)
    engine.close()
