"""verifiers v1 tasksets run through verifiers' own machinery with our engine; under 0.3.x and 0.4.x.

The bundled ``repeat_letter_taskset`` is the embedded default task written the v1 way: rolled out
through ``Env.run_slot`` and verifiers' interception server (its upstream hop in-process), it must sample exactly
what ``repeat_letter`` samples on the same rows and seeds — the same ids, logprobs and rewards — and
every sample must hold the sampled ids (0 drift, 0 ledger breaks). CI runs this file under both
verifiers releases (``.ci/verifiers-0.4``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from bridges.envs.registry import load_environment
from bridges.runtime.errors import ConfigError
from bridges.workflows.rollouts import run_group
from bridges.workflows.samples import SampleStats, state_to_samples

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture(autouse=True)
def _fixtures_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(FIXTURES))


def _client(path: Path, name: str) -> Any:
    from bridges.adapters.hf import HFEngine
    from bridges.client import EngineClient

    return EngineClient(HFEngine.from_pretrained(str(path)), model_name=name)


def test_the_bundled_taskset_resolves_as_verifiers_resolves_an_id():
    env = load_environment("repeat-letter-taskset", taskset={"num_tasks": 16})
    assert type(env).__name__ == "V1Environment" and env.env_id == "repeat-letter-taskset"
    assert env.env_args == {"taskset": {"num_tasks": 16}}
    assert len(env.get_dataset()) == 16 and env.rubric.get_reward_func_names() == ["trace_reward"]
    row = env.get_dataset()[0]
    (message,) = row["prompt"]
    assert (
        message["role"] == "user"
        and message["content"] in "abcdefgh"
        and row["info"] == {"v1_task": 0, "v1_seat": "agent"}
    )
    assert env.rescore_refusal and "v1 taskset" in env.rescore_refusal


@pytest.mark.parametrize(
    ("env_args", "sentence"),
    [
        ({"taskset": {"cases": "x"}}, "env_args.taskset.cases of the verifiers v1 taskset 'vf_v1_fault_taskset': Input should be a valid list."),
        ({"bogus": 1}, "env_args.bogus of the verifiers v1 taskset 'vf_v1_fault_taskset': Extra inputs are not permitted."),
        ({"taskset": {"explode_on_load": True}}, "the verifiers v1 taskset 'vf_v1_fault_taskset' raised in load(): RuntimeError: the dataset is missing"),
    ],
)
def test_bad_env_args_and_a_raising_load_are_one_sentence(env_args: dict[str, Any], sentence: str):
    with pytest.raises(ConfigError) as info:
        load_environment("vf_v1_fault_taskset", **env_args)
    assert str(info.value) == sentence


def test_a_harness_that_needs_a_container_is_refused_naming_the_setting():
    """``codex`` needs a container runtime (``NEEDS_CONTAINER``), which no run here provides; ``bash``
    (verifiers' default) needs none and runs on the subprocess runtime (test_verifiers_v1_programs)."""
    with pytest.raises(ConfigError) as info:
        load_environment("vf_v1_fixture_taskset", agent={"harness": {"id": "codex"}})
    assert str(info.value) == (
        "agent 'agent' of the verifiers v1 taskset 'vf_v1_fixture_taskset' runs on the 'codex' harness, a program "
        "that needs a container runtime, which this run does not provide; run it on verifiers' null (chat) "
        "harness: set env_args.agent.harness.id=null."
    )
    env = load_environment("vf_v1_fixture_taskset", agent={"harness": {"id": "null"}})
    assert type(env).__name__ == "V1Environment"


def test_a_missing_verifiers_extra_is_one_sentence(monkeypatch: pytest.MonkeyPatch):
    from bridges.runtime.errors import MissingExtraError

    monkeypatch.setitem(sys.modules, "verifiers", None)
    monkeypatch.delitem(sys.modules, "bridges.environments.repeat_letter_taskset", raising=False)
    with pytest.raises(MissingExtraError, match=r"pip install 'rl-bridges\[verifiers\]'"):
        load_environment("repeat_letter_taskset")


@pytest.mark.parametrize("model", ["tiny", "tiny-qwen2.5"])
async def test_episodes_sample_exactly_what_the_native_task_samples(bridges_cache_dir: Path, model: str):
    """Same rows, same seeds: verifiers' machinery in between changes no id, reward or logprob (beyond
    what batching does to fp32 sums)."""
    from bridges.models.tiny import resolve_model_path

    client = _client(Path(resolve_model_path(model)), model)
    native, v1 = load_environment("repeat_letter"), load_environment("repeat_letter_taskset")
    for index in range(3):
        row_native, row_v1 = dict(native.get_dataset()[index]), dict(v1.get_dataset()[index])
        assert row_native["prompt"] == row_v1["prompt"]
        a = await run_group(native, row_native, client, 4, {"seed": index}, model=model)
        b = await run_group(v1, row_v1, client, 4, {"seed": index}, model=model)
        for x, y in zip(a.states, b.states, strict=True):
            assert [t.completion_ids for t in x.turns] == [t.completion_ids for t in y.turns] != [[]]
            # the engine batches concurrent requests: fp32 sums in another batch shape differ in the 7th digit
            assert y.turns[0].logprobs == pytest.approx(x.turns[0].logprobs, abs=1e-5)
            assert y.reward == pytest.approx(x.reward) and y.stop_reason == "completed" and y.error is None
            assert y.completion == x.completion and y.metrics["num_turns"] == 1.0
            stats = SampleStats()
            (sample,) = state_to_samples(y, advantage=1.0, stats=stats)
            assert stats.breaks == 0 and y.drift_tokens in (0, None)
            assert sample.token_ids == y.turns[0].prompt_ids + y.turns[0].completion_ids


async def test_a_failing_reward_load_or_episode_is_a_masked_rollout_with_its_reason(tiny_path: Path):
    env = load_environment("vf_v1_fault_taskset", timeout={"episode": 2})
    client = _client(tiny_path, "tiny")
    seen = {}
    for row in env.get_dataset():
        (state,) = (
            await run_group(env, dict(row), client, 1, {"seed": 1, "max_tokens": 4}, model="tiny")
        ).states
        seen[row["info"]["v1_task"]] = (state.stop_reason, state.reward, state.error)
    assert seen[0] == ("completed", 1.0, None)
    assert seen[1][:2] == ("reward_error", None) and "ValueError: the reward broke" in seen[1][2]
    assert seen[2] == ("reward_error", None, "the trace's reward is nan.")
    assert seen[3][:2] == ("timeout", None) and "exceeded its 2s deadline" in seen[3][2]
    assert seen[4][:2] == ("env_error", None) and "RuntimeError: the env's run broke" in seen[4][2]
    assert seen[5][:2] == ("env_error", None) and "RuntimeError: the env's finalize broke" in seen[5][2]


def test_rescore_refuses_v1_traces_in_one_sentence(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    from bridges.rescore import main as rescore_main
    from bridges.runs.config import run_cli

    traces = tmp_path / "traces.jsonl"
    traces.write_text('{"example_id": 0}\n')
    with pytest.raises(SystemExit) as exit_:
        run_cli(rescore_main, [f"traces={traces}", "env=repeat_letter_taskset"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: bridges.rescore cannot score traces of a verifiers v1 taskset again")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["traces.jsonl"]


def test_bridges_eval_on_a_v1_taskset(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    import json

    from bridges.eval import main

    argv = ["env=repeat_letter_taskset", "model=tiny", "num_examples=4", "rollouts_per_example=2",
            f"output={tmp_path}", "progress=false"]
    assert main(argv) == 0
    records = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert len(records) == 8 and all(r["error"] is None and 0.0 <= r["reward"] <= 2.0 for r in records)
    assert all(r["metrics"]["num_turns"] == 1.0 for r in records)
    assert json.loads((tmp_path / "metadata.json").read_text())["env"] == "repeat_letter_taskset"


async def test_the_session_endpoint_refuses_bad_requests_and_keeps_calls_per_session(tiny_path: Path):
    import httpx

    from bridges.adapters.verifiers import v1_endpoint
    from bridges.adapters.verifiers.v1_endpoint import SessionEndpoint

    async with SessionEndpoint() as endpoint, httpx.AsyncClient() as http:
        base_url = endpoint.url_for(_client(tiny_path, "tiny"))
        named = endpoint.open_episode("0")  # what every call of the episode carries
        chat = {"model": "tiny", "messages": [{"role": "user", "content": "a"}], "max_tokens": 3, **named}
        url = f"{base_url}/chat/completions"
        auth = {"Authorization": f"Bearer {endpoint.secret}"}
        assert base_url.startswith("http://127.0.0.1:")
        assert (await http.post(url, json=chat)).status_code == 401
        assert (await http.post(url, json=chat, headers={"Authorization": "Bearer wrong"})).status_code == 401
        assert (await http.post(url, content=b"{not json", headers=auth)).status_code == 400
        assert (await http.post(url, json=[1, 2], headers=auth)).status_code == 400
        assert (await http.post(url, json={**chat, "n": "two"}, headers=auth)).status_code == 400
        huge = b'{"messages": "' + b"x" * (v1_endpoint.MAX_BODY_BYTES + 10) + b'"}'
        assert (await http.post(url, content=huge, headers=auth)).status_code == 413
        for session in ("s1", "s2", "s1"):
            answer = await http.post(url, json=chat, headers={**auth, "X-Session-ID": session})
            assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["role"] == "assistant"
        first, second = endpoint.take("0", "s1"), endpoint.take("0", "s2")
        assert len(first) == 2 and len(second) == 1 and endpoint.take("0", "s1") == []
        unnamed = await http.post(url, json=chat, headers=auth)  # before: every such call shared one session
        assert unnamed.status_code == 400 and "X-Session-ID" in unnamed.json()["error"]["message"]
        assert all(r.choices[0].token_ids for r in first + second)  # the sampled ids, kept per session
        v1_endpoint.MAX_CALLS_PER_SESSION, cap = 1, v1_endpoint.MAX_CALLS_PER_SESSION
        try:
            assert (
                await http.post(url, json=chat, headers={**auth, "X-Session-ID": "s3"})
            ).status_code == 200
            capped = await http.post(url, json=chat, headers={**auth, "X-Session-ID": "s3"})
            assert capped.status_code == 429 and "cap" in capped.json()["error"]["message"]
        finally:
            v1_endpoint.MAX_CALLS_PER_SESSION = cap
        v1_endpoint.MAX_SESSIONS_PER_EPISODE, most = 4, v1_endpoint.MAX_SESSIONS_PER_EPISODE
        try:  # a caller inventing session ids: capped per episode, and all freed when the episode ends
            statuses = [(await http.post(url, json=chat, headers={**auth, "X-Session-ID": f"x{i}"})).status_code
                        for i in range(5)]
        finally:
            v1_endpoint.MAX_SESSIONS_PER_EPISODE = most
        assert statuses == [200, 200, 200, 429, 429]  # s1 and s2 were taken: s3 and x0-x2 fill the four
        endpoint.end_episode("0")  # as after a failed episode, whose sessions were never taken
        assert endpoint.sessions == {} and (await http.post(url, json=chat, headers={**auth, "X-Session-ID": "y"})).status_code == 404
        unnamed_episode = {k: v for k, v in chat.items() if k != "bridges_episode"}
        assert (await http.post(url, json=unnamed_episode, headers={**auth, "X-Session-ID": "y"})).status_code == 404


def test_an_infinite_taskset_evaluates_and_trains_under_this_release(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """``INFINITE = True`` and a generator ``load()`` (a self-play game's shape): read through the
    release's own bounding view (0.3 ``head``, 0.4 ``take``; before, 0.4 stopped at ``.head``)."""
    import json

    import verifiers

    from bridges.adapters.verifiers.v1_taskset import MAX_TASKS
    from bridges.eval import main as evaluate
    from bridges.train import main as train

    env = load_environment("vf_v1_infinite_taskset")
    rows = env.get_dataset()
    assert len(rows) == MAX_TASKS and rows[0]["prompt"][0]["content"].startswith("Say ")
    argv = ["env=vf_v1_infinite_taskset", "model=tiny", "num_examples=4", "rollouts_per_example=2",
            f"output={tmp_path / 'eval'}", "progress=false"]
    assert evaluate(argv) == 0
    records = [json.loads(line) for line in (tmp_path / "eval" / "results.jsonl").read_text().splitlines()]
    assert len(records) == 8 and all(r["error"] is None and 0.0 <= r["reward"] <= 2.0 for r in records)
    argv = ["env=vf_v1_infinite_taskset", "progress=false", "trainer.max_steps=2", "trainer.batch_size=2",
            "trainer.group_size=2", f"output_dir={tmp_path}", "run_name=endless"]
    assert train(argv) == 0
    steps = [json.loads(x) for x in (tmp_path / "endless" / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2] and all(s["episodes/masked_fraction"] == 0.0 for s in steps)
    assert verifiers.__version__ in ("0.3.1", "0.4.0")  # CI runs this file under both releases


def test_serving_opens_once_for_rollouts_in_waves_and_closes_with_its_loop(
    tiny_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """One serving per loop, kept between waves of rollouts (opening it cost 50 ms of a 5 ms rollout),
    closed after its linger and when its loop shuts down; every episode shares one endpoint config, so
    verifiers builds one model client for all of them."""
    import asyncio

    from bridges.adapters.verifiers import v1_serving

    env, client = load_environment("repeat_letter_taskset"), _client(tiny_path, "tiny")
    row = dict(env.get_dataset()[0])
    opened: list[Any] = []
    real_open = v1_serving.Serving._open

    async def counted(self: Any) -> None:
        opened.append(self)
        await real_open(self)

    monkeypatch.setattr(v1_serving.Serving, "_open", counted)
    monkeypatch.setattr(v1_serving, "LINGER_S", 0.3)

    async def waves() -> Any:
        for i in range(3):  # one rollout at a time: the serving stays open between them
            group = await run_group(env, row, client, 1, {"seed": i}, model="tiny")
            assert group.states[0].error is None
        serving = opened[0]
        first, second = (serving.context(client, "tiny", None).client for _ in range(2))
        assert serving.is_open and first == second
        await asyncio.sleep(0.6)  # past the linger: closed
        assert not serving.is_open
        await run_group(env, row, client, 1, {"seed": 9}, model="tiny")  # opened again
        return serving

    serving = asyncio.run(waves())
    assert len(opened) == 2 and opened[0] is opened[1]
    assert not serving.is_open  # the loop's shutdown cancelled the closer, which closed it


def test_a_program_cannot_name_another_episode_in_its_calls():
    """The episode rides in each call as a sampling key; verifiers' interception overlays the rollout's
    sampling on every dialect's body, so a program that sends its own ``bridges_episode`` (to land in
    another rollout's record) is overruled. Asserted on this release's own dialects."""
    from verifiers.v1.dialects import DIALECTS
    from verifiers.v1.types import SamplingConfig

    from bridges.adapters.verifiers.v1_endpoint import EPISODE_KEY

    sampling = SamplingConfig(**{EPISODE_KEY: "7", "seed": 3})
    for dialect in DIALECTS:
        body = {"model": "m", "messages": [], "input": [], "max_tokens": 4, EPISODE_KEY: "0"}
        assert dialect.apply_overrides(body, "m", sampling)[EPISODE_KEY] == "7", type(dialect).__name__
