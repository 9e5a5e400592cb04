"""Environments written for verifiers 0.1.8-0.3.x, loaded with the real verifiers package and run here.

The fixture module (tests/fixtures/vf_fixture_envs.py) is written exactly as an Environments-Hub
module: ``import verifiers as vf``, ``vf.SingleTurnEnv``/``vf.MultiTurnEnv``, ``vf.Rubric`` with an
individual and a group reward function, and a ``@vf.stop`` condition.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from trace_files import run_traces

from bridges.envs.registry import load_environment

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture(autouse=True)
def _fixtures_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(FIXTURES))


@pytest.fixture
def client(tiny_path: Path) -> Any:
    from bridges.adapters.hf import HFEngine
    from bridges.client import EngineClient

    return EngineClient(HFEngine.from_pretrained(str(tiny_path)), model_name="tiny")


def expected_reward(metrics: dict[str, float]) -> float:
    return metrics["lowercase_share"] + 0.5 * metrics["longest_in_group"]


async def test_single_turn_env_scores_with_verifiers_rubric_and_group_rewards(
    client: Any, tiny_tokenizer: Any
):
    env = load_environment("vf:vf_fixture_envs", kind="single")
    assert type(env).__name__ == "VerifiersEnvironment" and env.env_id == "vf:vf_fixture_envs"
    result = await env.evaluate(client, "tiny", num_examples=3, rollouts_per_example=4, progress=False)
    assert len(result.states) == 12
    for start in range(0, 12, 4):
        group = result.states[start : start + 4]
        lengths = [len(s.completion[-1]["content"] or "") for s in group]
        # the group function saw exactly this group: 1.0 for its longest completions, else 0.0
        assert [s.metrics["longest_in_group"] for s in group] == [float(n == max(lengths)) for n in lengths]
        for state in group:
            assert state.reward == pytest.approx(expected_reward(state.metrics))
            (turn,) = state.turns
            assert (
                turn.prompt_ids
                == tiny_tokenizer.apply_chat_template(state.prompt, add_generation_prompt=True)["input_ids"]
            )
            assert 0 < len(turn.completion_ids) == len(turn.logprobs) <= 8


async def test_multi_turn_env_keeps_its_stop_condition_and_extends_token_exactly(
    client: Any, tiny_tokenizer: Any
):
    from bridges.workflows.rollouts import run_group
    from bridges.workflows.samples import SampleStats, state_to_samples

    env = load_environment("vf:vf_fixture_envs", kind="multi")
    group = await run_group(env, dict(env.get_dataset()[0]), client, 3, {"seed": 5}, model="tiny")
    for state in group.states:
        # drift is measured (how far a re-render of the random tiny model's replies would differ: a sample's
        # luck); what is trained is what was sampled, whatever the drift: no ledger break below
        assert state.stop_reason == "two_rounds" and state.extras == {} and state.drift_tokens is not None
        assert len(state.turns) == 3 and [m["role"] for m in state.completion] == [
            "assistant",
            "user",
        ] * 2 + ["assistant"]
        stats = SampleStats()
        (sample,) = state_to_samples(state, advantage=1.0, stats=stats)
        assert stats.breaks == 0  # every turn's prompt is the last prompt + the ids sampled + the env reply
        masked = tiny_tokenizer.decode(
            [t for t, m in zip(sample.token_ids, sample.loss_mask, strict=True) if not m]
        )
        assert "round 1: again" in masked and "round 2: again" in masked
        assert state.reward == pytest.approx(expected_reward(state.metrics))
    assert group.contributes_gradient or group.skip_reason == "zero_variance"


def test_stop_conditions_carry_their_signature_and_are_otherwise_themselves():
    import inspect

    from bridges.adapters.verifiers.presign import Presigned, presign_hooks

    env = load_environment("vf:vf_fixture_envs", kind="multi")
    hooks = env.vf_env._stop_conditions
    assert hooks and all(isinstance(h, Presigned) for h in hooks)  # the adapter presigned them
    names = [h.__name__ for h in hooks]
    assert "two_rounds" in names and "max_turns_reached" in names
    for hook in hooks:
        assert inspect.signature(hook) == inspect.signature(hook.func)
        assert hook.__self__ is env.vf_env  # attributes of the bound method reach through
    assert presign_hooks(env.vf_env) == 0  # idempotent: nothing wrapped twice


def test_a_bare_module_returning_a_verifiers_env_is_wrapped():
    env = load_environment("vf_fixture_envs", kind="single")
    assert type(env).__name__ == "VerifiersEnvironment" and env.env_id == "vf_fixture_envs"
    # verifiers' MultiTurnEnv adds its monitor rubric (num_turns, weight 0) beside the env's own
    assert env.rubric.get_reward_func_names() == ["lowercase_share", "longest_in_group", "num_turns"]
    assert env.rubric.get_reward_weights() == [1.0, 0.5, 0.0]


def test_a_verifiers_version_outside_the_range_is_one_sentence(monkeypatch: pytest.MonkeyPatch):
    import verifiers

    from bridges.runtime.errors import ConfigError

    monkeypatch.setattr(verifiers, "__version__", "0.5.0")
    with pytest.raises(ConfigError, match=r"supports verifiers 0\.1\.8-0\.4\.x") as info:
        load_environment("vf:vf_fixture_envs")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("env_id", ["vf:vf_fixture_envs", "vf_fixture_envs"])
def test_rescore_refuses_verifiers_traces_in_one_sentence_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], env_id: str
):
    from bridges.rescore import main as rescore_main
    from bridges.runs.config import run_cli

    traces = tmp_path / "traces.jsonl"
    traces.write_text(json.dumps({"example_id": 0, "prompt": [], "completion": []}) + "\n")
    with pytest.raises(SystemExit) as exit_:
        run_cli(rescore_main, [f"traces={traces}", f"env={env_id}", "env_args={kind: single}"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # a bare module is built first (datasets' bar)
    assert err.startswith("error: bridges.rescore cannot score traces of a verifiers environment again")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["traces.jsonl"]


async def test_a_plain_openai_client_against_an_endpoint_records_one_turn_per_reply(client: Any):
    """engine=openai: the rollout's session records what the endpoint sent, a turn per reply, with the
    token ids when the endpoint sends them (bridges.serve does), as MultiTurnEnv records them."""
    import openai

    from bridges.server.app import serve_in_thread
    from bridges.workflows.rollouts import run_group

    env = load_environment("vf:vf_fixture_envs", kind="multi")
    with serve_in_thread(client) as server:
        plain = openai.AsyncOpenAI(base_url=server.base_url, api_key="unused")
        group = await run_group(env, dict(env.get_dataset()[0]), plain, 2, {"seed": 5}, model="tiny")
        await plain.close()
    for state in group.states:
        assert len(state.turns) == 3 and state.stop_reason == "two_rounds"
        assert state.metrics["num_turns"] == 3.0  # three assistant replies, as the token-exact run counts
        for turn in state.turns:
            assert turn.prompt_ids and 0 < len(turn.completion_ids) == len(turn.logprobs)
    # scored: the verifiers state each rollout carried is let go (results keep only our record), and a
    # second scoring of the same rollouts says why it cannot read it instead of scoring nothing
    assert all(s._native is None for s in group.states)
    with pytest.raises(ValueError, match="each once"):
        await env.rubric.score_group(group.states)


@pytest.mark.slow
def test_a_verifiers_env_trains_with_the_grpo_backend(tmp_path: Path):
    from bridges.grpo.trainer import run
    from bridges.runs.config import parse_config
    from bridges.runs.train_config import TrainConfig

    config = parse_config(
        TrainConfig,
        [
            "env=vf:vf_fixture_envs", "env_args.kind=multi", f"output_dir={tmp_path}", "progress=false",
            "trainer.max_steps=2", "trainer.batch_size=2", "trainer.group_size=4", "run_name=vf",
        ],
    )
    assert run(config) == 0
    rows = [json.loads(x) for x in (tmp_path / "vf" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(
        r["episodes/total"] == 8 and r["episodes/masked"] == 0 and r["stop/two_rounds"] == 8 for r in rows
    )
    assert rows[-1]["weight_version"] >= 1  # the policy trained and the engine got the new weights
    trace = run_traces(tmp_path / "vf")[0]
    assert trace["provenance"]["env_id"] == "vf:vf_fixture_envs" and len(trace["turns"]) == 3
    del sys.modules["vf_fixture_envs"]


async def test_a_raising_nan_or_hung_verifiers_reward_is_a_reward_error_not_a_zero(client: Any):
    import vf_fixture_envs

    from bridges.adapters.verifiers import wrap
    from bridges.adapters.verifiers.environment import VerifiersRubric

    # 5 s, not 1: on a loaded 2-core machine a healthy reward's thread could wait past 1 s for its turn
    env = wrap(vf_fixture_envs.load_faulty_environment(), env_id="vf:faulty", reward_timeout=5.0)
    assert isinstance(env.rubric, VerifiersRubric)
    result = await env.evaluate(client, "tiny", num_examples=6, rollouts_per_example=2, progress=False)
    by_answer = {}
    for state in result.states:
        by_answer.setdefault(state.answer, []).append(state)
    expected = {
        "1": "reward function 'picky' raised ValueError: picky cannot parse this",
        "2": "reward function 'picky' returned nan, which is not a finite number.",
        "3": "reward function 'picky' raised TimeoutError: reward function 'picky' did not finish within 5.0 s.",
        "4": "reward function 'group_breaks_on_four' raised RuntimeError: group function failed",
    }
    for answer, error in expected.items():
        for state in by_answer[answer]:
            assert state.stop_reason == "reward_error" and state.reward is None and state.error == error
    for answer in ("0", "5"):
        for state in by_answer[answer]:
            assert state.error is None and state.reward == pytest.approx(1.5)
    assert result.summary()["num_errored"] == 8  # verifiers alone would have said 0
