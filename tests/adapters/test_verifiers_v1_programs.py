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
from v1_rollouts import our_states
from vf_reference import verifiers_own_results

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SAMPLING = {"max_tokens": 64}
pytestmark = pytest.mark.skipif(shutil.which("uv") is None, reason="uv is in the dev extra; verifiers' programs need it")


@pytest.fixture(autouse=True)
def _fixtures_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(FIXTURES))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(FIXTURES), os.environ.get("PYTHONPATH")])))


async def _ours(engine: ScriptedEngine, num_tasks: int) -> dict[tuple[int, str], Any]:
    from bridges.client import EngineClient

    client = EngineClient(engine, model_name="scripted")
    return await our_states("vf_v1_bash_taskset", {"taskset": {"num_tasks": num_tasks}}, client, SAMPLING)


@pytest.mark.slow
async def test_a_bash_agent_gives_verifiers_own_rewards_on_the_subprocess_runtime(qwen_tokenizer: Any):
    from bridges.client import EngineClient
    from bridges.server.app import serve_in_thread

    ours_engine, theirs_engine = ScriptedEngine(qwen_tokenizer, bash_script), ScriptedEngine(qwen_tokenizer, bash_script)
    ours = await _ours(ours_engine, 6)
    with serve_in_thread(EngineClient(theirs_engine, model_name="scripted")) as server:
        theirs = await verifiers_own_results("vf_v1_bash_taskset", {"taskset": {"num_tasks": 6}}, server.base_url,
                                             "scripted", SAMPLING, harness=None)
    assert {key: state.reward for key, state in ours.items()} == {key: theirs[key][0] for key in ours}
    assert set(ours_engine.calls) == set(theirs_engine.calls) and len(ours_engine.calls) == 12  # 2 calls a task
    assert sorted(state.reward for state in ours.values()) == [0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    for state in ours.values():  # the tool ran: its output is what the agent read
        assert len(state.turns) == 2 and '"name": "bash"' in qwen_tokenizer.decode(state.turns[0].completion_ids)
