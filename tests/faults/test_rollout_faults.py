"""Every fault at once, through the workflows every backend uses (``run_groups`` over a real client).

One batch holds a row per fault; each group must come back complete (episodes produced = episodes
requested), the faulty ones masked with the injected reason, the healthy ones untouched, and no
masked rollout may carry an advantage.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from faulty_engine import FaultyEngine

from bridges.envs.base import parse_info
from bridges.envs.registry import load_environment
from bridges.workflows.rollouts import run_groups

ENGINE_FAULTS = {
    "[engine:permanent]": "permanent",
    "[engine:hang]": "hang",
    "[engine:nan]": "nan",
    "[engine:none]": "none",
    "[engine:transient]": "transient",
}
EXPECTED = {  # case -> (stop reason, text in the error) ; None: a healthy rollout
    "ok": None,
    "engine:transient": None,  # retried once, then fine
    "env_raises": ("env_error", "injected env_response failure"),
    "reward_raises": ("reward_error", "injected reward failure"),
    "overlong": ("prompt_too_long", "context window"),
    "engine:permanent": ("engine_error", "injected permanent engine failure"),
    "engine:hang": ("engine_error", "Timeout"),
    "engine:nan": ("engine_error", "non-finite logprob"),
    "engine:none": ("engine_error", "non-finite logprob"),
}


async def test_one_batch_with_every_fault_completes_and_masks_exactly_the_faulty_rollouts(tiny_path: Path):
    from bridges.adapters.hf import HFEngine
    from bridges.client import EngineClient

    env = load_environment("bridges_fault_env")
    engine = FaultyEngine(HFEngine.from_pretrained(str(tiny_path)), plan_prompts=dict(ENGINE_FAULTS))
    client = EngineClient(engine, model_name="tiny")
    rows = [dict(r) for r in env.get_dataset()]
    started = time.perf_counter()
    groups = await run_groups(env, rows, client, 2, {"seed": 0}, model="tiny")
    elapsed = time.perf_counter() - started
    assert len(groups) == len(rows) == len(EXPECTED)
    assert sum(len(g.states) for g in groups) == 2 * len(rows)  # produced = requested
    for row, group in zip(rows, groups, strict=True):
        case = parse_info(row["info"])["case"]
        expected = EXPECTED[case]
        for state, advantage in zip(group.states, group.advantages, strict=True):
            if expected is None:
                assert state.trainable and state.stop_reason == "max_turns" and len(state.turns) == 2, (
                    case,
                    state.error,
                )
            else:
                reason, text = expected
                assert not state.trainable and state.stop_reason == reason and text in (state.error or ""), (
                    case,
                    state,
                )
                assert advantage == 0.0 and state.reward is None
    assert engine.injected.count("transient") == 1 and "hang" in engine.injected
    assert elapsed < 30  # the hang is bounded by model_timeout (2 s x 2 attempts), not waited out


async def test_malformed_and_unknown_tool_calls_go_back_to_the_model(tool_model_path: Path):
    import bridges_test_trl_envs as envs

    from bridges.adapters.hf import HFEngine
    from bridges.client import EngineClient

    env = envs.add_tool()
    bad_json = 'script:<tool_call>\n{"name": "add", "arguments": "{\\"a\\": 2,"}\n</tool_call>'
    unknown = 'script:<tool_call>\n{"name": "multiply", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    for script, sentence in (
        (bad_json, "are not valid JSON"),
        (unknown, "there is no tool named 'multiply'"),
    ):
        engine = FaultyEngine(HFEngine.from_pretrained(str(tool_model_path)), plan={0: script})
        client = EngineClient(engine, model_name="tool")
        (group,) = await run_groups(
            env, [dict(env.get_dataset()[0])], client, 1, {"temperature": 0.0}, model="tool"
        )
        (state,) = group.states
        tool_messages = [m for m in state.completion if m["role"] == "tool"]
        assert (
            tool_messages
            and tool_messages[0]["content"].startswith("Error:")
            and sentence in tool_messages[0]["content"]
        )
        assert not state.errored and state.metrics["tool_errors"] >= 1.0  # the rollout goes on


@pytest.fixture(autouse=True)
def _trl_envs_importable(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "adapters" / "envs"))
