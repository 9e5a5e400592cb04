"""Datasets, generate/evaluate: concurrency bound, per-group callback, export and summary numbers."""

from __future__ import annotations

import asyncio
import json
import math

import pytest
from core_fakes import ChatServer, completion, error
from datasets import Dataset

from bridges.envs import SingleTurnEnv
from bridges.envs.rubric import Rubric
from bridges.envs.types import State
from bridges.runtime.errors import ConfigError


def exact(completion, answer) -> float:
    return float(completion[-1]["content"] == answer)


def qa(n: int) -> Dataset:
    return Dataset.from_dict({"question": [f"q{i}" for i in range(n)], "answer": [str(i) for i in range(n)]})


def test_dataset_formatting_question_prompt_system_few_shot_and_lazy_builder():
    built = []

    def builder():
        built.append(1)
        return qa(3)

    few = [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}]
    env = SingleTurnEnv(dataset=builder, system_prompt="sys", few_shot=few)
    assert built == []  # lazy until first use
    ds = env.get_dataset()
    assert built == [1] and env.get_dataset() is not None and built == [1]
    assert ds["example_id"] == [0, 1, 2]
    assert ds[1]["prompt"] == [{"role": "system", "content": "sys"}, *few, {"role": "user", "content": "q1"}]
    assert len(env.get_dataset(n=2)) == 2
    shuffled = env.get_dataset(seed=3)["example_id"]
    assert sorted(shuffled) == [0, 1, 2] and shuffled == env.get_dataset(seed=3)["example_id"]
    assert env.get_eval_dataset()["question"] == ["q0", "q1", "q2"]  # falls back to the training set


def test_prompt_column_gets_system_prompt_unless_present_and_info_json_is_parsed():
    rows = Dataset.from_list(
        [
            {
                "prompt": [{"role": "user", "content": "a"}],
                "info": json.dumps({"level": 2}),
                "difficulty": "hard",
            },
            {
                "prompt": [{"role": "system", "content": "own"}, {"role": "user", "content": "b"}],
                "info": "{}",
                "difficulty": "easy",
            },
        ]
    )
    env = SingleTurnEnv(eval_dataset=rows, system_prompt="sys")
    ds = env.get_eval_dataset()
    assert ds["answer"] == ["", ""]
    assert [m["content"] for m in ds[0]["prompt"]] == ["sys", "a"]
    assert [m["content"] for m in ds[1]["prompt"]] == ["own", "b"]
    state = env.init_state(ds[0])
    assert state.info == {"level": 2} and state.row == {"difficulty": "hard"} and state.answer == ""
    assert state.prompt == [{"role": "system", "content": "sys"}, {"role": "user", "content": "a"}]
    with pytest.raises(ConfigError, match="needs a 'prompt' or a 'question' column"):
        SingleTurnEnv(dataset=Dataset.from_dict({"text": ["x"]})).get_dataset()
    with pytest.raises(ConfigError, match="no training dataset"):
        SingleTurnEnv().get_dataset()


async def test_generate_respects_max_concurrent_calls_on_group_and_exports():
    async def respond(body, i):
        await asyncio.sleep(0.02)
        return completion(body["messages"][-1]["content"].replace("q", ""))

    server = ChatServer(respond)
    env = SingleTurnEnv(rubric=Rubric([exact]), max_concurrent=64)
    groups: list[list[State]] = []
    result = await env.generate(
        qa(4),
        server.client(),
        "m",
        rollouts_per_example=3,
        max_concurrent=2,
        progress=False,
        on_group=groups.append,
    )
    assert server.peak == 2 and len(server.requests) == 12
    assert sorted(len(g) for g in groups) == [3, 3, 3, 3]
    assert all(len({s.example_id for s in g}) == 1 for g in groups)
    assert [s.example_id for s in result.states] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert all(s.reward == 1.0 for s in result.states)
    ds = result.to_dataset()
    assert len(ds) == 12 and ds[4]["completion"][0]["content"] == "1"
    assert ds[4]["reward"] == 1.0 and ds[4]["metrics"]["num_turns"] == 1.0


async def test_run_group_calls_share_the_environment_bound():
    async def respond(body, i):
        await asyncio.sleep(0.02)
        return completion("x")

    server = ChatServer(respond)
    env = SingleTurnEnv(max_concurrent=3)
    client = server.client()
    groups = await asyncio.gather(*(env.run_group({"question": "q"}, client, "m", 4) for _ in range(2)))
    assert [len(g) for g in groups] == [4, 4] and server.peak == 3


async def test_malformed_row_is_refused_before_any_request():
    server = ChatServer()
    rows = [{"question": "q0"}, {"answer": "no prompt"}]
    with pytest.raises(ConfigError, match="needs a 'prompt' \\(list of messages\\) or a 'question'"):
        await SingleTurnEnv().generate(rows, server.client(), "m", progress=False)
    assert server.requests == []


class CrashesOnRowTwo(SingleTurnEnv):
    """A subclass bug: its rollout raises (after a while) for one row instead of recording an error."""

    async def rollout(self, row, client, model, sampling_args=None):
        if row["example_id"] == 2:
            await asyncio.sleep(0.3)
            raise RuntimeError("subclass bug")
        return await super().rollout(row, client, model, sampling_args)


async def test_finished_groups_reach_on_group_before_a_later_group_fails():
    server = ChatServer(lambda body, i: completion("0"))
    env = CrashesOnRowTwo(rubric=Rubric([exact]))
    saved: list[int] = []

    async def persist(states):
        saved.extend(s.example_id for s in states)

    with pytest.raises(RuntimeError, match="subclass bug"):
        await env.generate(
            qa(3), server.client(), "m", rollouts_per_example=2, progress=False, on_group=persist
        )
    assert sorted(saved) == [0, 0, 1, 1]


async def test_summary_numbers_with_errored_rollouts():
    def respond(body, i):
        if body["messages"][-1]["content"] == "boom":
            return error(400, "unsupported argument")
        return completion("4")

    server = ChatServer(respond)
    env = SingleTurnEnv(rubric=Rubric([exact]))
    rows = [
        {"question": "a", "answer": "4"},
        {"question": "b", "answer": "5"},
        {"question": "boom", "answer": "4"},
    ]
    result = await env.generate(rows, server.client(), "m", rollouts_per_example=2, progress=True)
    summary = result.summary()
    assert summary["num_rollouts"] == 6 and summary["num_examples"] == 3 and summary["num_errored"] == 2
    assert summary["reward_mean"] == pytest.approx(0.5)
    assert summary["reward_stderr"] == pytest.approx(math.sqrt((1 / 3) / 4))
    assert summary["pass_at_k"] == {"k": 2, "value": pytest.approx(1 / 3)}
    assert summary["pass_all_k"] == pytest.approx(1 / 3)
    assert summary["stop_reasons"] == {"completed": 4, "engine_error": 2}
    assert summary["prompt_tokens_mean"] == pytest.approx(20 / 6) and summary[
        "completion_tokens_mean"
    ] == pytest.approx(2.0)
    assert result.summary(pass_threshold=2.0)["pass_at_k"]["value"] == 0.0
    assert [s.reward for s in result.states if s.errored] == [None, None]


def test_evaluate_sync_num_examples_and_skip_ids():
    server = ChatServer(lambda body, i: completion("0"))
    env = SingleTurnEnv(eval_dataset=qa(5), rubric=Rubric([exact]))
    result = env.evaluate_sync(server.client(), "m", num_examples=4, skip_example_ids=[1, 2], progress=False)
    assert [s.example_id for s in result.states] == [0, 3]
    assert [s.reward for s in result.states] == [1.0, 0.0]
    again = env.evaluate_sync(server.client(), "m", num_examples=1, rollouts_per_example=2, progress=False)
    assert len(again.states) == 2  # a second event loop works with the same environment
