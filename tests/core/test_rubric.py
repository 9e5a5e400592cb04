"""Rubric injection, weights, group functions, failures; JudgeRubric through the real openai SDK."""

from __future__ import annotations

import asyncio

import pytest
from core_fakes import ChatServer, completion, error

from bridges.envs.judge import JudgeRubric
from bridges.envs.parsers import XMLParser
from bridges.envs.rubric import Rubric, reward
from bridges.envs.types import State
from bridges.runtime.errors import ConfigError


def make_state(text: str, answer: str = "4", **kw) -> State:
    return State(
        prompt=[{"role": "user", "content": "2+2?"}],
        completion=[{"role": "assistant", "content": text}],
        answer=answer,
        **kw,
    )


async def test_injection_by_name_extra_columns_class_objects_and_weights():
    seen = {}

    def exact(completion, answer, parser) -> float:
        return float(parser.parse_answer(completion) == answer)

    async def uses_columns(difficulty, info, task, example_id, tokenizer_like) -> float:
        seen.update(difficulty=difficulty, info=info, task=task, example_id=example_id, obj=tokenizer_like)
        return 0.5

    def everything(**kwargs) -> float:
        seen["kwargs"] = set(kwargs)
        return 1.0

    rubric = Rubric([exact, uses_columns], weights=[2.0, 1.0], parser=XMLParser(["answer"]))
    rubric.add_metric(everything)
    rubric.add_class_object("tokenizer_like", "TOK")
    state = make_state(
        "<answer>4</answer>", info={"k": 1}, task="math", example_id=3, row={"difficulty": "easy"}
    )
    await rubric.score_rollout(state)
    assert state.reward == pytest.approx(2.0 * 1.0 + 1.0 * 0.5 + 0.0 * 1.0)
    assert state.metrics == {"exact": 1.0, "uses_columns": 0.5, "everything": 1.0}
    assert seen["difficulty"] == "easy" and seen["info"] == {"k": 1} and seen["task"] == "math"
    assert seen["example_id"] == 3 and seen["obj"] == "TOK"
    assert {
        "prompt",
        "completion",
        "answer",
        "state",
        "info",
        "task",
        "example_id",
        "parser",
        "difficulty",
    } <= seen["kwargs"]


def test_weights_length_mismatch_is_one_sentence():
    with pytest.raises(ConfigError, match="2 reward functions but 1 weights"):
        Rubric([lambda: 1.0, lambda: 0.0], weights=[1.0])


async def test_reward_decorator_weight_and_async_function():
    @reward(weight=0.25)
    async def slow_one(completion) -> float:
        await asyncio.sleep(0)
        return 1.0

    @reward
    def plain(completion) -> float:
        return 2.0

    rubric = Rubric([slow_one, plain])
    assert rubric.get_reward_weights() == [0.25, 1.0]
    state = make_state("x")
    await rubric.score_rollout(state)
    assert state.reward == pytest.approx(0.25 + 2.0)


async def test_raising_reward_marks_errored_never_zero():
    def boom(completion) -> float:
        raise ValueError("bad parse")

    rubric = Rubric([lambda completion: 1.0, boom])
    state = make_state("x")
    await rubric.score_rollout(state)
    assert state.reward is None and state.errored
    assert state.stop_reason == "reward_error"
    assert state.error == "reward function 'boom' raised ValueError: bad parse"


async def test_reward_timeout_marks_errored():
    async def hangs(completion) -> float:
        await asyncio.sleep(5)
        return 1.0

    rubric = Rubric([hangs], timeout=0.05)
    state = make_state("x")
    await rubric.score_rollout(state)
    assert state.reward is None and state.stop_reason == "reward_error"
    assert state.error.startswith("reward function 'hangs' raised TimeoutError")


async def test_sync_reward_timeout_starts_when_a_thread_picks_the_call_up():
    import time

    def slow(completion) -> float:
        time.sleep(0.1)
        return 1.0

    rubric = Rubric([slow], timeout=0.3)
    states = [make_state(str(i)) for i in range(64)]  # more calls than worker threads: some queue
    await rubric.score_group(states)
    assert [s.reward for s in states] == [1.0] * 64


async def test_group_function_sees_only_valid_states_of_its_group():
    received = []

    def rank(completions, answers, states) -> list[float]:
        received.append([c[-1]["content"] for c in completions])
        assert len(answers) == len(states) == len(completions)
        return [float(len(c[-1]["content"])) for c in completions]

    def per_rollout(completion) -> float:
        return 10.0

    rubric = Rubric([rank, per_rollout], weights=[1.0, 0.5])
    states = [
        make_state("a"),
        make_state("bbb", stop_reason="engine_error", error="EngineError: x"),
        make_state("cc"),
    ]
    await rubric.score_group(states)
    assert received == [["a", "cc"]]
    assert [s.reward for s in states] == [1.0 + 5.0, None, 2.0 + 5.0]
    assert states[1].metrics == {} and states[1].error == "EngineError: x"


async def test_group_function_with_list_annotation_and_wrong_length():
    def bad(prompts) -> list[float]:
        return [1.0]

    rubric = Rubric([bad])
    states = [make_state("a"), make_state("b")]
    await rubric.score_group(states)
    assert all(s.reward is None and s.stop_reason == "reward_error" for s in states)
    assert "returned 1 values for a group of 2" in states[0].error


def judge_server(verdicts):
    def respond(body, i):
        return verdicts(body, i)

    return ChatServer(respond)


async def test_judge_yes_no_and_cache():
    server = judge_server(
        lambda body, i: completion("Yes." if "4" in body["messages"][0]["content"] else "no")
    )
    rubric = JudgeRubric(
        judge_client=server.client(), judge_model="judge", judge_sampling_args={"temperature": 0}
    )
    good, wrong = make_state("it is 4"), make_state("it is 5", answer="7")
    await rubric.score_group([good, wrong])
    assert (good.reward, wrong.reward) == (1.0, 0.0)
    assert good.metrics == {"judge_reward": 1.0}
    assert server.requests[0]["model"] == "judge" and server.requests[0]["temperature"] == 0
    assert "2+2?" in server.requests[0]["messages"][0]["content"]
    # cached per judge prompt in the state: asking again makes no request
    before = len(server.requests)
    assert await rubric.judge(good.prompt, good.completion, good.answer, good) == "Yes."
    assert len(server.requests) == before


async def test_judge_garbage_marks_errored():
    server = judge_server(lambda body, i: completion("maybe, hard to say"))
    rubric = JudgeRubric(judge_client=server.client())
    state = make_state("4")
    await rubric.score_rollout(state)
    assert state.reward is None and state.stop_reason == "reward_error"
    assert state.error.startswith(
        "reward function 'judge_reward' raised JudgeError: the judge answered 'maybe"
    )


async def test_judge_timeout_retried_then_errored():
    async def slow(body, i):
        await asyncio.sleep(1.0)
        return completion("yes")

    server = judge_server(slow)
    rubric = JudgeRubric(judge_client=server.client(), timeout=0.05, max_retries=2, retry_base_delay=0.001)
    state = make_state("4")
    await rubric.score_rollout(state)
    assert len(server.requests) == 3 and state["judge_attempts"] == 3
    assert state.reward is None
    assert "the judge failed after 3 attempts (TimeoutError" in state.error


async def test_judge_transient_500_then_success_and_custom_reward_replaces_default():
    server = judge_server(
        lambda body, i: error(500, "overloaded", kind="server_error") if i == 0 else completion("yes")
    )
    rubric = JudgeRubric(judge_client=server.client(), retry_base_delay=0.001, max_concurrent=1)

    async def strict(judge, prompt, completion, answer, state) -> float:
        return 1.0 if (await judge(prompt, completion, answer, state)).startswith("yes") else 0.0

    rubric.add_reward_func(strict)
    assert rubric.get_reward_func_names() == ["strict"]
    state = make_state("4")
    await rubric.score_rollout(state)
    assert state.reward == 1.0 and len(server.requests) == 2


async def test_a_cheap_sync_reward_moves_onto_the_loop_thread_and_a_slow_one_stays_on_threads():
    import threading
    import time

    from bridges.runtime.usercode import PROVEN_AFTER

    loop_thread = threading.get_ident()
    seen: dict[str, list[int]] = {"cheap": [], "slow": [], "pinned": []}

    def cheap(completion) -> float:
        seen["cheap"].append(threading.get_ident())
        return 1.0

    def slow(completion) -> float:
        seen["slow"].append(threading.get_ident())
        time.sleep(0.002)  # over CHEAP_CALL_S: never proven cheap
        return 0.5

    def pinned(completion) -> float:
        seen["pinned"].append(threading.get_ident())
        return 0.0

    rubric = Rubric(funcs=[cheap, slow])
    threaded = Rubric(funcs=[pinned], inline_cheap=False)
    for _ in range(PROVEN_AFTER + 4):  # one at a time: each call sees the cost of the ones before
        state = make_state("4")
        await rubric.score_rollout(state)
        await threaded.score_rollout(make_state("4"))
        assert state.reward == 1.5 and state.metrics == {"cheap": 1.0, "slow": 0.5}
    assert loop_thread not in seen["cheap"][:PROVEN_AFTER]  # proven on worker threads first
    assert seen["cheap"][PROVEN_AFTER:] == [loop_thread] * 4  # then called inline
    assert loop_thread not in seen["slow"]
    assert loop_thread not in seen["pinned"]


async def test_a_cheap_reward_that_turns_slow_or_hangs_inline_is_bounded_and_sent_back_to_threads():
    import threading
    import time

    from bridges.runtime.usercode import PROVEN_AFTER

    loop_thread = threading.get_ident()
    calls: list[int] = []

    def flaky(completion) -> float:
        calls.append(threading.get_ident())
        if len(calls) == PROVEN_AFTER + 1:  # the first inline call never returns (pure Python)
            while True:
                pass
        return 1.0

    rubric = Rubric(funcs=[flaky], timeout=0.3)
    for _ in range(PROVEN_AFTER):
        state = make_state("4")
        await rubric.score_rollout(state)
        assert state.reward == 1.0
    hung = make_state("4")
    started = time.monotonic()
    await rubric.score_rollout(hung)  # inline now: the watchdog interrupts it at its bound
    assert time.monotonic() - started < 5
    assert calls[-1] == loop_thread
    assert hung.reward is None and hung.stop_reason == "reward_error"
    assert "did not finish within 0.3 s" in hung.error
    after = make_state("4")
    await rubric.score_rollout(after)  # demoted: a worker thread again
    assert after.reward == 1.0 and calls[-1] != loop_thread
