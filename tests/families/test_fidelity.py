"""The fidelity suite: a few hundred random multi-turn tool episodes per family, 0 ledger breaks.

The random model over a real vocabulary samples tokenisations no tokenizer would produce, tool-call
markup that is often malformed and end-of-turn tokens at random: every turn must still extend the
previous prompt + sampled ids exactly, while a re-render would drift (which is asserted too, so the
suite cannot pass by never exercising the problem). ``benchmarks/fidelity.py`` runs 1,000 per family.
"""

from __future__ import annotations

import asyncio

import pytest

from bridges.models.tiny import FAMILY_MODEL_NAMES

EPISODES = 64  # enough for every assertion below; the benchmark runs 1,000


@pytest.mark.slow
@pytest.mark.parametrize("name", FAMILY_MODEL_NAMES)
def test_every_turn_extends_the_ledger_exactly(family_paths, name):
    from bridges.adapters.hf import HFEngine
    from bridges.client import EngineClient
    from bridges.jobs.fidelity import run_fidelity

    engine = HFEngine.from_pretrained(str(family_paths[name]), name=name, max_batch_size=64)
    try:
        client = EngineClient(engine, model_name=name)
        report = asyncio.run(run_fidelity(client, client.family.name, EPISODES, seed=7))
    finally:
        engine.close()
    assert (report.episodes, report.turns) == (EPISODES, 4 * EPISODES)  # a failed episode raises instead
    assert report.ledger_breaks == 0
    assert report.streamed_episodes == EPISODES // 4
    assert report.tool_call_turns > EPISODES // 2  # forced and free calls both happen
    assert report.drifted_turns > EPISODES // 4 and report.drift_tokens > 0  # a re-render would have drifted
    if name == "tiny-qwen3":
        assert report.reasoning_turns > 0
    if name in (
        "tiny-qwen3",
        "tiny-mistral",
    ):  # history rewritten by design: most turns re-render differently
        assert report.rewritten_turns > report.turns // 2
