"""Agents on a verifiers program harness (``bash``) run their program on verifiers' ``subprocess``
runtime, through ``uv`` as verifiers ships it; under 0.3 and 0.4 (issue 41, item 3).

The same script answers rl-bridges' path and verifiers' own evaluation (``vf_reference``, the taskset's
own harness kept): the coding agent calls the ``bash`` tool, reads its output and replies. Rewards and
the engine's calls must be equal, and every sample must hold exactly the ids the engine sampled."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from scripted_engine import ScriptedEngine, bash_script
from vf_reference import verifiers_own_results

from bridges.envs.registry import load_environment
from bridges.workflows.rollouts import run_group
from bridges.workflows.samples import SampleStats, state_to_samples

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SAMPLING = {"max_tokens": 64}
pytestmark = pytest.mark.skipif(shutil.which("uv") is None, reason="uv is in the dev extra; verifiers' programs need it")


@pytest.fixture(autouse=True)
def _fixtures_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(FIXTURES))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(FIXTURES), os.environ.get("PYTHONPATH")])))


async def _ours(tokenizer: Any, engine: ScriptedEngine, num_tasks: int) -> dict[tuple[int, str], Any]:
    from bridges.client import EngineClient

    client = EngineClient(engine, model_name="scripted")
    env = load_environment("vf_v1_bash_taskset", taskset={"num_tasks": num_tasks})
    states = {}
    for row in env.get_dataset():
        (state,) = (await run_group(env, dict(row), client, 1, dict(SAMPLING), model="scripted")).states
        assert state.error is None and state.stop_reason == "completed", state.error
        stats = SampleStats()
        (sample,) = state_to_samples(state, advantage=1.0, stats=stats)
        sampled = [i for turn in state.turns for i in turn.completion_ids]
        assert stats.breaks == 0 and [i for i, m in zip(sample.token_ids, sample.loss_mask, strict=True) if m] == sampled
        states[(row["info"]["v1_task"], row["info"]["v1_seat"])] = state
    return states


@pytest.mark.slow
async def test_a_bash_agent_gives_verifiers_own_rewards_on_the_subprocess_runtime(qwen_tokenizer: Any):
    from bridges.client import EngineClient
    from bridges.server.app import serve_in_thread

    ours_engine, theirs_engine = ScriptedEngine(qwen_tokenizer, bash_script), ScriptedEngine(qwen_tokenizer, bash_script)
    ours = await _ours(qwen_tokenizer, ours_engine, 6)
    with serve_in_thread(EngineClient(theirs_engine, model_name="scripted")) as server:
        theirs = await verifiers_own_results("vf_v1_bash_taskset", {"taskset": {"num_tasks": 6}}, server.base_url,
                                             "scripted", SAMPLING, harness=None)  # fmt: skip
    assert {key: state.reward for key, state in ours.items()} == {key: theirs[key][0] for key in ours}
    assert set(ours_engine.calls) == set(theirs_engine.calls) and len(ours_engine.calls) == 12  # 2 calls a task
    assert sorted(state.reward for state in ours.values()) == [0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    for state in ours.values():  # the tool ran: its output is what the agent read
        assert len(state.turns) == 2 and '"name": "bash"' in qwen_tokenizer.decode(state.turns[0].completion_ids)
