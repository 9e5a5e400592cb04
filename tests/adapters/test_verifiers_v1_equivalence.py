"""v1 tasksets give the same rewards through rl-bridges as in verifiers' own evaluation; under 0.3 and 0.4.

One script answers both paths (``ScriptedEngine``: the reply is a function of the prompt, tokenized with
the real Qwen2.5 BPE vocabulary), so the paths differ only in what runs between the model and the
reward: rl-bridges' in-process seat and per-session endpoint, or verifiers' null harness program per
agent run and its ``EvalClient`` (``vf_reference``). Tasksets in the style of the public examples: one
single-turn (the bundled ``repeat_letter_taskset``), one multi-turn ended by ``@vf.stop``, one
multi-agent ``Env.run`` (two trainable seats conversing, a host stood down in ``setup()``), and one
with a response interception hook. Each rollout must also train on exactly what was sampled: 0 drift,
0 ledger breaks, the sample's ids the turns' ids. CI runs this file under both verifiers releases.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from process_marks import processes_marked
from scripted_engine import ScriptedEngine
from v1_rollouts import our_states
from vf_reference import programs_run_with_this_python, verifiers_own_results

from bridges.envs.registry import load_environment
from bridges.workflows.rollouts import run_group
from bridges.workflows.samples import SampleStats, state_to_samples

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SAMPLING = {"max_tokens": 48}
CASES: dict[str, tuple[dict[str, Any], set[str]]] = {
    "repeat_letter_taskset": ({"taskset": {"num_tasks": 3}}, {"agent"}),
    "vf_v1_turns_taskset": ({"taskset": {"num_tasks": 3}}, {"agent"}),
    "vf_v1_duel_taskset": ({"taskset": {"num_tasks": 2}}, {"player0", "player1"}),
    "vf_v1_hook_taskset": ({"taskset": {"num_tasks": 3}}, {"agent"}),
    "vf_v1_tools_taskset": ({"taskset": {"num_tasks": 2}}, {"agent"}),
}


@pytest.fixture(autouse=True)
def _fixtures_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(FIXTURES))
    # verifiers starts a toolset as ``python -m <its module>``
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(FIXTURES), os.environ.get("PYTHONPATH")])))


@pytest.fixture(scope="module")
def qwen_tokenizer(bridges_cache_dir: Path) -> Any:
    from transformers import AutoTokenizer

    from bridges.models.tiny import resolve_model_path

    return AutoTokenizer.from_pretrained(resolve_model_path("tiny-qwen2.5"))


async def _ours(
    name: str, env_args: dict[str, Any], tokenizer: Any, engine: ScriptedEngine | None = None
) -> dict[tuple[int, str], Any]:
    from bridges.client import EngineClient

    return await our_states(name, env_args, EngineClient(engine or ScriptedEngine(tokenizer), model_name="scripted"),
                            SAMPLING)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
async def test_rewards_equal_verifiers_own_evaluation_of_the_same_script(
    name: str, qwen_tokenizer: Any, tmp_path: Path
):
    from bridges.client import EngineClient
    from bridges.server.app import serve_in_thread

    env_args, seats = CASES[name]
    our_engine, their_engine = ScriptedEngine(qwen_tokenizer), ScriptedEngine(qwen_tokenizer)
    ours = await _ours(name, env_args, qwen_tokenizer, our_engine)
    assert {seat for _, seat in ours} == seats
    reference = EngineClient(their_engine, model_name="scripted")
    with serve_in_thread(reference) as server, programs_run_with_this_python(tmp_path):
        theirs = await verifiers_own_results(name, env_args, server.base_url, "scripted", SAMPLING)
    # the engine saw the same prompt ids from both paths (an episode per seat here, so compare as sets)
    assert set(our_engine.calls) == set(their_engine.calls) and our_engine.calls
    assert {key: state.reward for key, state in ours.items()} == {key: theirs[key][0] for key in ours}
    assert {key: state.completion[-1]["content"] for key, state in ours.items()} == {
        key: theirs[key][1] for key in ours
    }
    assert len({state.reward for state in ours.values()}) > 1  # the script varies what is rewarded


async def test_a_rewritten_reply_trains_on_what_was_sampled_and_the_trace_says_so(qwen_tokenizer: Any):
    """The hook served "LETTER x"; the sample holds the ids the engine sampled, and the state counts it."""
    states = await _ours("vf_v1_hook_taskset", {"taskset": {"num_tasks": 4}}, qwen_tokenizer)
    rewritten = [s for s in states.values() if s.metrics["v1/rewritten_replies"] == 1.0]
    untouched = [s for s in states.values() if s.metrics["v1/rewritten_replies"] == 0.0]
    assert rewritten and untouched
    for state in rewritten:
        served = state.completion[-1]["content"]
        sampled = qwen_tokenizer.decode(state.turns[-1].completion_ids, skip_special_tokens=True)
        assert served.startswith("LETTER ") and served != sampled and served[-1] in sampled
        assert state.reward == 1.0
    assert all(s.reward == 0.0 for s in untouched)


async def test_each_seat_of_a_multi_agent_episode_is_its_own_group(qwen_tokenizer: Any):
    """Rows are task × trainable seat; the stood-down host has none; each seat's sample is its own trace,
    a conversation of several resumed segments extended token-exactly."""
    env = load_environment("vf_v1_duel_taskset", taskset={"num_tasks": 2}, rounds=3)
    assert [row["info"] for row in env.get_dataset()] == [
        {"v1_task": t, "v1_seat": s} for t in (0, 1) for s in ("player0", "player1")
    ]
    states = await _ours("vf_v1_duel_taskset", {"taskset": {"num_tasks": 2}, "rounds": 3}, qwen_tokenizer)
    for (_, seat), state in states.items():
        assert len(state.turns) == 3 and state.metrics["v1/seat_traces"] == 1.0
        assert f"You are player {seat[-1]}." in qwen_tokenizer.decode(state.turns[0].prompt_ids)
        for before, after in zip(state.turns, state.turns[1:], strict=False):
            assert after.prompt_ids[: len(before.prompt_ids)] == before.prompt_ids


async def test_a_toolset_server_that_dies_is_a_masked_rollout_and_no_process_outlives_it(
    qwen_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
):
    from bridges.client import EngineClient

    marker = f"VF_V1_TOOLS_CRASH={uuid.uuid4().hex}"
    monkeypatch.setenv(*marker.split("="))
    env = load_environment("vf_v1_tools_taskset", taskset={"num_tasks": 1}, timeout={"episode": 5})
    client = EngineClient(ScriptedEngine(qwen_tokenizer), model_name="scripted")
    (row,) = env.get_dataset()
    (state,) = (await run_group(env, dict(row), client, 1, dict(SAMPLING), model="scripted")).states
    # verifiers waits for the server until the episode's deadline: a masked rollout, saying so
    assert state.stop_reason == "timeout" and state.reward is None and not state.trainable
    assert "exceeded its 5s deadline" in (state.error or ""), state.error
    assert processes_marked(marker) == []


class _SlowEngine(ScriptedEngine):
    def __init__(self, tokenizer: Any, delay: float) -> None:
        super().__init__(tokenizer)
        self.delay = delay

    async def generate(self, prompt_ids: list[int], params: Any, n: int = 1) -> Any:
        import asyncio

        await asyncio.sleep(self.delay)
        return await super().generate(prompt_ids, params, n)


async def test_two_clients_of_one_loop_share_verifiers_one_interception_server(qwen_tokenizer: Any):
    """Tinker swaps in a sampling client per weight version while the last batch still runs. verifiers'
    env holds one interception server at a time, so both clients are answered on one endpoint: a
    second server opened beside the first took its place, and the first rollout started after that
    lost its calls when the second client's batch ended and closed it."""
    import asyncio

    from bridges.client import EngineClient

    env = load_environment("repeat_letter_taskset", taskset={"num_tasks": 2})
    row = dict(env.get_dataset()[0])
    old, new = (EngineClient(_SlowEngine(qwen_tokenizer, 0.6), model_name="scripted") for _ in range(2))

    async def rollout(client: Any, start: float) -> Any:
        await asyncio.sleep(start)
        return (await run_group(env, dict(row), client, 1, dict(SAMPLING), model="scripted")).states[0]

    # the old client's first rollout holds its serving open; the new client's runs 0.2-0.8 s; the old
    # client's second starts at 0.4 s, while both are open, and is still waiting when the new one ends
    states = await asyncio.gather(rollout(old, 0.0), rollout(new, 0.2), rollout(old, 0.4))
    assert [s.error for s in states] == [None] * 3 and all(s.stop_reason == "completed" for s in states)


async def test_a_tool_that_raises_answers_the_model_with_its_error_and_the_rollout_goes_on(qwen_tokenizer: Any):
    """The toolset's ``repeat`` raises past 64 letters: the model reads the error as the tool's answer
    (as verifiers' null program shows it), and the rollout completes, scored as usual."""
    import re

    def script(prompt: str) -> str:
        if "<tool_response>" in prompt:
            return "the tool refused"
        name = re.search(r'"name": "(\w+)"', prompt.split("<tools>", 1)[1]).group(1)  # type: ignore[union-attr]
        return f'<tool_call>\n{{"name": "{name}", "arguments": {{"letter": "c", "times": 100}}}}\n</tool_call>'

    engine = ScriptedEngine(qwen_tokenizer, script)
    (state,) = (await _ours("vf_v1_tools_taskset", {"taskset": {"num_tasks": 1}}, qwen_tokenizer, engine)).values()
    tool_messages = [m for m in state.completion if m["role"] == "tool"]
    assert len(tool_messages) == 1 and "at most 64 letters" in str(tool_messages[0]["content"])
    assert state.completion[-1]["content"] == "the tool refused" and state.reward == 0.0 and len(state.turns) == 2


class _SeedsEngine(ScriptedEngine):
    """Records each call's seed, with the sampled ids' call index."""

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        self.seeds: list[int | None] = []

    async def generate(self, prompt_ids: list[int], params: Any, n: int = 1) -> Any:
        self.seeds.append(params.seed)
        return await super().generate(prompt_ids, params, n)


async def test_best_of_n_trains_each_attempt_once_and_no_two_attempts_share_a_seed(qwen_tokenizer: Any):
    """verifiers' own ``best-of-n`` env over the bundled taskset: one seat, three attempts an episode.
    After the first batch has shown three traces an episode, a seeded group of six plays two episodes
    and trains on all six traces, each once; every attempt samples with a seed of its own (verifiers
    sends one sampling config for the whole episode; at one identical prompt, one seed would sample
    three identical attempts)."""
    from bridges.client import EngineClient

    engine = _SeedsEngine(qwen_tokenizer)
    client = EngineClient(engine, model_name="scripted")
    env = load_environment("repeat_letter_taskset", id="best-of-n", n=3, taskset={"num_tasks": 1})
    assert type(env.vf_env).__name__ == "BestOfNEnv" and env.trainable_seats == ["agent"]
    row = dict(env.get_dataset()[0])
    first = (await run_group(env, row, client, 6, {**SAMPLING, "seed": 10}, model="scripted")).states
    assert len(engine.seeds) == 18 and env.traces_per_seat == {"agent": 3}  # six own episodes, learnt
    engine.seeds.clear()
    second = (await run_group(env, row, client, 6, {**SAMPLING, "seed": 40}, model="scripted")).states
    assert len(engine.seeds) == 6 and len(set(engine.seeds)) == 6  # two episodes, six distinct seeds
    for states in (first, second):
        assert all(s.stop_reason == "completed" and s.metrics["v1/seat_traces"] == 3.0 for s in states)
        assert len({s.extras["v1_trace_id"] for s in states}) == 6  # no trace trains twice
        assert all(s.metrics["best"] in (0.0, 1.0) and s.reward is not None for s in states)
    assert sorted(s.metrics["v1/shared_episode"] for s in second) == [0.0] * 2 + [1.0] * 4
    for state in second:
        stats = SampleStats()
        (sample,) = state_to_samples(state, advantage=1.0, stats=stats)
        assert stats.breaks == 0 and [i for i, m in zip(sample.token_ids, sample.loss_mask, strict=True) if m] == [
            i for turn in state.turns for i in turn.completion_ids
        ]
