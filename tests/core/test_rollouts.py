"""Rollout loops against a scripted remote endpoint: turns, stops, tokens and every failure path."""

from __future__ import annotations

import asyncio

import pytest
from core_fakes import ChatServer, completion, error

from bridges.envs import MultiTurnEnv, SingleTurnEnv, stop
from bridges.envs.parsers import XMLParser
from bridges.envs.rubric import Rubric
from bridges.envs.types import State
from bridges.runtime.errors import ConfigError

ROW = {"question": "2+2?", "answer": "4", "example_id": 0}


def fast(env_cls=SingleTurnEnv, **kw):
    kw.setdefault("retry_base_delay", 0.001)
    return env_cls(**kw)


async def test_single_turn_rollout_tokens_and_score():
    server = ChatServer(
        lambda body, i: completion(
            "<answer>4</answer>",
            prompt_token_ids=[1, 2, 3],
            token_ids=[7, 8, 2],
            token_logprobs=[-0.1, -0.2, -0.3],
            weight_version=5,
        )
    )
    parser = XMLParser(["answer"])
    rubric = Rubric(
        [lambda completion, answer, parser: float(parser.parse_answer(completion) == answer)], parser=parser
    )
    env = fast(system_prompt="Be brief.", rubric=rubric, sampling_args={"temperature": 0.5, "max_tokens": 9})
    state = await env.rollout(ROW, server.client(), "policy", {"max_tokens": 16})
    await env.score_rollout(state)
    (req,) = server.requests
    assert (
        req["model"] == "policy"
        and req["temperature"] == 0.5
        and req["max_tokens"] == 16
        and "tools" not in req
    )
    assert req["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
    ]
    assert state.stop_reason == "completed" and state.error is None and state.reward == 1.0
    assert state.completion == [{"role": "assistant", "content": "<answer>4</answer>"}]
    (turn,) = state.turns
    assert (turn.prompt_ids, turn.completion_ids, turn.logprobs) == ([1, 2, 3], [7, 8, 2], [-0.1, -0.2, -0.3])
    assert turn.finish_reason == "stop" and turn.weight_version == 5
    assert state.metrics["num_turns"] == 1.0 and state.row == {"question": "2+2?"}
    assert state.extras["usage"] == {"prompt_tokens": 5, "completion_tokens": 3}
    assert state.timing.total_s >= state.timing.generation_s > 0


async def test_remote_endpoint_without_ids_gives_empty_lists_and_standard_logprobs_fallback():
    server = ChatServer(lambda body, i: completion("x", logprobs=[-0.5, -1.5]))
    state = await fast().rollout(ROW, server.client(), "m")
    assert state.turns[0].prompt_ids == [] and state.turns[0].completion_ids == []
    assert state.turns[0].logprobs == [-0.5, -1.5]


class Guess(MultiTurnEnv):
    """The model guesses; the env says higher/lower; stops on the secret or when told to give up."""

    async def setup_state(self, state: State) -> None:
        state["secret"] = "3"
        state["order"] = []

    async def env_response(self, messages, state):
        guess = messages[-1]["content"]
        return [{"role": "user", "content": "correct" if guess == state["secret"] else "wrong"}]

    @stop
    def solved(self, state) -> bool:
        state["order"].append("solved")
        return bool(state.completion) and state.completion[-1]["content"] == "correct"

    @stop(priority=10)
    async def gave_up(self, state) -> bool:
        state["order"].append("gave_up")
        return any(m["content"] == "give up" for m in state.completion)

    @stop
    def another(self, state) -> bool:
        state["order"].append("another")
        return False


async def test_multi_turn_env_response_stop_order_and_reason():
    guesses = ["1", "2", "3"]
    server = ChatServer(lambda body, i: completion(guesses[i]))
    env = fast(Guess, max_turns=10)
    state = await env.rollout(ROW, server.client(), "m")
    assert state.stop_reason == "solved" and state.error is None
    assert [m["content"] for m in state.completion] == ["1", "wrong", "2", "wrong", "3", "correct"]
    # the model saw the whole conversation each turn
    assert [len(r["messages"]) for r in server.requests] == [1, 3, 5]
    # priority 10 first, then ties by name; checked before and after every env response
    assert state["order"][:4] == ["gave_up", "another", "solved", "gave_up"]
    assert state.metrics["num_turns"] == 3.0


async def test_max_turns_and_higher_priority_stop_wins():
    server = ChatServer(lambda body, i: completion("give up" if i == 1 else "0"))
    state = await fast(Guess, max_turns=2).rollout(ROW, server.client(), "m")
    assert state.stop_reason == "gave_up"  # both fire after turn 2; priority 10 beats max_turns (0)
    server2 = ChatServer(lambda body, i: completion("0"))
    state2 = await fast(Guess, max_turns=2).rollout(ROW, server2.client(), "m")
    assert state2.stop_reason == "max_turns" and len(state2.turns) == 2 and len(server2.requests) == 2


async def test_prompt_too_long_from_bad_request_code_and_vllm_message():
    server = ChatServer(
        lambda body, i: error(400, "prompt has 5000 tokens, more than 4096", code="prompt_too_long")
    )
    state = await fast().rollout(ROW, server.client(), "m")
    assert state.stop_reason == "prompt_too_long" and state.errored
    assert state.error.startswith("BadRequestError: ") and "5000 tokens" in state.error
    vllm = ChatServer(lambda body, i: error(400, "This model's maximum context length is 4096 tokens."))
    assert (await fast().rollout(ROW, vllm.client(), "m")).stop_reason == "prompt_too_long"
    other = ChatServer(lambda body, i: error(400, "temperature must be positive"))
    state = await fast().rollout(ROW, other.client(), "m")
    assert state.stop_reason == "engine_error" and len(other.requests) == 1  # not retried


async def test_engine_500_retried_then_success():
    server = ChatServer(
        lambda body, i: error(500, "boom", kind="server_error") if i < 2 else completion("fine")
    )
    state = await fast(max_retries=2).rollout(ROW, server.client(), "m")
    assert state.error is None and state.stop_reason == "completed" and len(server.requests) == 3


async def test_engine_permanent_failure_is_engine_error_after_retries():
    server = ChatServer(lambda body, i: error(503, "down", kind="server_error"))
    state = await fast(max_retries=2).rollout(ROW, server.client(), "m")
    assert len(server.requests) == 3 and state.stop_reason == "engine_error"
    assert state.error.startswith("the model call failed after 3 attempts (InternalServerError:")
    assert state.turns == [] and state.metrics == {"num_turns": 0.0}


async def test_model_timeout_retried_then_engine_error():
    async def slow(body, i):
        await asyncio.sleep(1.0)
        return completion("late")

    server = ChatServer(slow)
    state = await fast(model_timeout=0.05, max_retries=1).rollout(ROW, server.client(), "m")
    assert len(server.requests) == 2 and state.stop_reason == "engine_error"
    assert "TimeoutError: no response within model_timeout=0.05 s" in state.error


async def test_rollout_timeout_keeps_finished_turns():
    async def respond(body, i):
        if i >= 1:
            await asyncio.sleep(2.0)
        return completion("0")

    server = ChatServer(respond)
    state = await fast(Guess, max_turns=5, rollout_timeout=0.2).rollout(ROW, server.client(), "m")
    assert state.stop_reason == "timeout" and state.errored
    assert state.error == "TimeoutError: the rollout did not finish within rollout_timeout=0.2 s."
    assert len(state.turns) == 1 and state.completion[:2] == [
        {"role": "assistant", "content": "0"},
        {"role": "user", "content": "wrong"},
    ]


class Broken(MultiTurnEnv):
    def __init__(self, where: str, **kw):
        super().__init__(**kw)
        self.where = where

    async def setup_state(self, state):
        if self.where == "setup":
            raise RuntimeError("no sandbox")

    async def env_response(self, messages, state):
        raise KeyError("secret")

    @stop
    def check(self, state) -> bool:
        if self.where == "stop":
            raise ZeroDivisionError("division by zero")
        return False


@pytest.mark.parametrize(
    ("where", "sentence"),
    [
        ("setup", "setup_state raised RuntimeError: no sandbox"),
        ("env", "env_response raised KeyError: 'secret'"),
        ("stop", "stop condition 'check' raised ZeroDivisionError: division by zero"),
    ],
)
async def test_env_exceptions_become_env_error(where, sentence):
    server = ChatServer()
    rubric = Rubric([lambda: 1.0])
    env = fast(Broken, where=where, max_turns=3, rubric=rubric)
    (state,) = await env.run_group(ROW, server.client(), "m", 1)
    assert state.stop_reason == "env_error" and state.error == sentence
    assert state.reward is None  # errored before scoring: never scored


class DriftClient:
    """The real SDK client plus the EngineClient's measure_drift hook."""

    def __init__(self, inner, result):
        self.chat, self.result, self.seen = inner.chat, result, None

    async def measure_drift(self, messages):
        self.seen = messages
        return self.result


async def test_drift_measured_on_conversation_ending_at_last_assistant():
    server = ChatServer(lambda body, i: completion("0"))
    client = DriftClient(server.client(), (4, 1))
    state = await fast(Guess, max_turns=2).rollout(ROW, client, "m")
    assert (state.drift_tokens, state.drifted_turns) == (4, 1)
    assert client.seen[-1] == {"role": "assistant", "content": "0"} and len(client.seen) == 4


async def test_failing_drift_measurement_does_not_fail_rollout():
    class Bad(DriftClient):
        async def measure_drift(self, messages):
            raise RuntimeError("ledger gone")

    server = ChatServer()
    state = await fast().rollout(ROW, Bad(server.client(), None), "m")
    assert state.error is None and state.drift_tokens is None
    assert state.extras["drift_error"] == "RuntimeError: ledger gone"


class Replies(MultiTurnEnv):
    def __init__(self, reply, **kw):
        super().__init__(max_turns=2, **kw)
        self.reply = reply

    async def env_response(self, messages, state):
        state.info["seen"].append(len(messages))
        return self.reply


async def test_env_response_may_return_one_message_and_info_is_not_shared_in_a_group():
    server = ChatServer()
    env = Replies({"role": "user", "content": "next"})
    row = {**ROW, "info": {"seen": []}}
    states = await env.run_group(row, server.client(), "m", 3)
    assert all(s.error is None and s.stop_reason == "max_turns" for s in states)
    assert [s.completion[1] for s in states] == [{"role": "user", "content": "next"}] * 3
    assert [s.info["seen"] for s in states] == [[2], [2], [2]] and row["info"]["seen"] == []


async def test_env_response_returning_text_is_env_error_sentence():
    state = await Replies("next").rollout({**ROW, "info": {"seen": []}}, ChatServer().client(), "m")
    assert state.stop_reason == "env_error"
    assert (
        state.error == "env_response raised TypeError: env_response must return a list of messages, got str."
    )


async def test_malformed_response_is_engine_error_and_n_is_refused():
    server = ChatServer(
        lambda body, i: {"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": []}
    )
    state = await fast().rollout(ROW, server.client(), "m")
    assert (
        state.stop_reason == "engine_error" and state.error == "EngineError: the model returned no choices."
    )
    with pytest.raises(ConfigError, match="sampling_args n=4 is not supported"):
        await fast().generate([ROW], server.client(), "m", sampling_args={"n": 4}, progress=False)
    assert len(server.requests) == 1


async def test_a_group_of_no_rollouts_is_one_sentence_from_the_one_place_that_checks():
    from bridges.workflows.rollouts import run_group

    server = ChatServer(lambda body, i: completion("<answer>4</answer>"))
    for n in (0, -2):
        with pytest.raises(ConfigError, match=rf"^group_size \(rollouts per example\) must be at least 1, got {n}\.$"):
            await run_group(fast(), ROW, server.client(), n)


async def test_the_shared_frame_times_and_counts_what_run_episode_fills():
    """Every environment's ``rollout`` is one frame (fresh state, merged sampling arguments, turns
    counted, wall time kept); an environment writes only ``run_episode``, and one that writes neither
    is refused naming the hook."""
    from bridges.envs.base import Environment
    from bridges.envs.types import Turn

    seen: list[dict] = []

    class TwoTurns(Environment):
        async def run_episode(self, row, state, client, model, args):
            seen.append(args)
            await asyncio.sleep(0.05)
            state.turns = [Turn(completion_ids=[1]), Turn(completion_ids=[2])]
            state.stop_reason = "completed"

    env = TwoTurns(sampling_args={"max_tokens": 4, "temperature": 0.5})
    state = await env.rollout(ROW, None, "m", {"temperature": 1.0})
    assert seen == [{"max_tokens": 4, "temperature": 1.0}]  # the run's arguments win over the env's
    assert state.metrics["num_turns"] == 2.0 and state.stop_reason == "completed"
    assert 0.05 <= state.timing.total_s < 5.0 and state.prompt[-1]["content"] == "2+2?"
    with pytest.raises(NotImplementedError, match=r"Environment does not implement run_episode\(\)"):
        await Environment().rollout(ROW, None, "m")
