"""The client contract, checked identically in-process and over HTTP with the stock SDK (docs/design.md §4).

Each test receives ``path``: an ``openai.AsyncOpenAI`` that is either ``EngineClient(HFEngine)`` or
the stock SDK talking to ``bridges.serve`` on loopback. Nothing here knows which.
"""

from __future__ import annotations

import json
import re
from typing import Any

import openai
import pytest

from bridges.client.tool_calls import tool_call_id
from bridges.envs.messages import to_message_dicts


def encode(tokenizer: Any, text: str) -> list[int]:
    return tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids


async def tool_turns(path: Any, case: Any, **kwargs: Any) -> tuple[Any, Any, list[Any]]:
    """Turn 1 (the model calls add) and turn 2 (after the tool result); returns both and the messages."""
    r1 = await path.client.chat.completions.create(
        model="tiny-tool", messages=case.prompt, tools=case.tools, temperature=0.0, max_tokens=64
    )
    call = r1.choices[0].message.tool_calls[0]
    messages = [
        *case.prompt,
        r1.choices[0].message,
        {"role": "tool", "tool_call_id": call.id, "content": "5"},
    ]
    r2 = await path.client.chat.completions.create(
        model="tiny-tool", messages=messages, tools=case.tools, temperature=0.0, max_tokens=64, **kwargs
    )
    return r1, r2, messages


async def test_tool_call_round_trip(path, tool_case):
    r1, r2, messages = await tool_turns(path, tool_case)
    choice = r1.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "add"
    assert json.loads(call.function.arguments) == {"a": 2, "b": 3}
    assert re.fullmatch(r"call_[0-9a-f]{24}", call.id) and call.id == tool_call_id(choice.token_ids, 0)
    assert choice.token_ids == encode(path.tokenizer, tool_case.call_text) + [path.tokenizer.eos_token_id]
    # the tool result goes back and the model answers in plain text
    assert r2.choices[0].message.content == tool_case.answer and r2.choices[0].finish_reason == "stop"


async def test_multi_turn_prompts_extend_token_exactly_with_zero_drift(path, tool_case):
    tok = path.tokenizer
    r1, r2, messages = await tool_turns(path, tool_case, extra_body={"return_drift": True})
    bridge_text = (
        "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    # turn-2 prompt = turn-1 prompt + sampled ids + "\n" the engine did not emit + the rendered tool message
    assert r2.prompt_token_ids == r1.prompt_token_ids + r1.choices[0].token_ids + encode(tok, bridge_text)
    assert (
        r2.prompt_token_ids
        == tok.apply_chat_template(
            to_message_dicts(messages), tools=tool_case.tools, add_generation_prompt=True
        )["input_ids"]
    )
    assert (r2.drift_tokens, r2.drifted_turns) == (0, 0)
    # a third turn keeps extending the same ledger
    third = [*messages, r2.choices[0].message, {"role": "user", "content": "Thanks!"}]
    r3 = await path.client.chat.completions.create(
        model="tiny-tool",
        messages=third,
        tools=tool_case.tools,
        temperature=0.0,
        max_tokens=8,
        extra_body={"return_drift": True},
    )
    history = r2.prompt_token_ids + r2.choices[0].token_ids
    assert r3.prompt_token_ids[: len(history)] == history
    assert r3.prompt_token_ids[len(history) :] == encode(
        tok, "\n<|im_start|>user\nThanks!<|im_end|>\n<|im_start|>assistant\n"
    )
    assert (r3.drift_tokens, r3.drifted_turns) == (0, 0)
    if path.name == "in_process":
        assert path.client.measure_drift([*third, r3.choices[0].message]) == (0, 0)


async def test_n_samples(path, tool_case):
    r = await path.client.chat.completions.create(
        model="tiny-tool", messages=tool_case.prompt, n=3, temperature=1.0, max_tokens=12, seed=1
    )
    assert [c.index for c in r.choices] == [0, 1, 2]
    for choice in r.choices:
        assert 1 <= len(choice.token_ids) <= 12
        assert len(choice.token_logprobs) == len(choice.token_ids)
        assert choice.finish_reason in ("stop", "length")


async def test_stop_reasons(path, tool_case):
    tok = path.tokenizer
    _, by_eos, messages = await tool_turns(path, tool_case)
    eos_choice = by_eos.choices[0]
    assert eos_choice.finish_reason == "stop" and eos_choice.token_ids[-1] == tok.eos_token_id
    assert "<|im_end|>" not in eos_choice.message.content

    async def answer(**kwargs: Any) -> Any:
        r = await path.client.chat.completions.create(
            model="tiny-tool", messages=messages, tools=tool_case.tools, temperature=0.0, **kwargs
        )
        return r.choices[0]

    by_length = await answer(max_tokens=3)
    assert by_length.finish_reason == "length" and by_length.token_ids == encode(tok, "The")
    by_stop = await answer(max_tokens=32, stop=["sum"])
    assert by_stop.finish_reason == "stop" and by_stop.message.content == "The "
    assert tok.decode(by_stop.token_ids).startswith("The sum")  # ids stay as sampled


async def test_logprobs_line_up_with_token_ids(path, tool_case):
    r = await path.client.chat.completions.create(
        model="tiny-tool", messages=tool_case.prompt, tools=tool_case.tools, temperature=0.0, logprobs=True
    )
    choice = r.choices[0]
    assert len(choice.logprobs.content) == len(choice.token_ids) == len(choice.token_logprobs)
    assert [e.logprob for e in choice.logprobs.content] == pytest.approx(choice.token_logprobs)
    assert all(lp <= 0.0 for lp in choice.token_logprobs)
    assert isinstance(r.weight_version, int) and len(r.prompt_token_ids) == r.usage.prompt_tokens


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"presence_penalty": 1.0}, "presence_penalty"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"tool_choice": {"type": "function", "function": {"name": "mul"}}}, "tool_choice"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"extra_body": {"min_p": 0.1}}, "min_p"),
    ],
)
async def test_bad_arguments_name_the_argument(path, tool_case, kwargs, name):
    with pytest.raises(openai.BadRequestError) as info:
        await path.client.chat.completions.create(
            model="tiny-tool", messages=tool_case.prompt, tools=tool_case.tools, **kwargs
        )
    assert f"'{name}'" in info.value.message


async def test_prompt_too_long(path):
    with pytest.raises(openai.BadRequestError) as info:
        await path.client.chat.completions.create(
            model="tiny-tool", messages=[{"role": "user", "content": "x" * 5000}], max_tokens=4
        )
    assert info.value.code == "prompt_too_long"


async def test_stop_token_ids_and_bare_string_stop(path, tool_case):
    tok = path.tokenizer
    _, _, messages = await tool_turns(path, tool_case)
    s_id = tok.convert_tokens_to_ids("s")

    async def answer(**kwargs: Any) -> Any:
        r = await path.client.chat.completions.create(
            model="tiny-tool",
            messages=messages,
            tools=tool_case.tools,
            temperature=0.0,
            max_tokens=32,
            **kwargs,
        )
        return r.choices[0]

    by_id = await answer(extra_body={"stop_token_ids": [s_id]})
    assert by_id.finish_reason == "stop" and by_id.token_ids == encode(tok, "The s")
    assert by_id.message.content == "The "  # the stop token is not shown
    by_str = await answer(stop="is")
    assert by_str.finish_reason == "stop" and by_str.message.content == "The sum "


async def test_each_of_n_branches_extends_its_own_ledger(path):
    tok = path.tokenizer
    prompt = [{"role": "user", "content": "Hello there"}]
    r1 = await path.client.chat.completions.create(
        model="tiny-tool", messages=prompt, n=3, temperature=1.0, max_tokens=6, seed=7
    )
    assert len({tuple(c.token_ids) for c in r1.choices}) > 1  # a random model at temperature 1
    for choice in r1.choices:
        follow = [*prompt, choice.message, {"role": "user", "content": "and?"}]
        r2 = await path.client.chat.completions.create(model="tiny-tool", messages=follow, max_tokens=2)
        closing = encode(tok, "\n") if choice.finish_reason == "stop" else encode(tok, "<|im_end|>\n")
        history = r1.prompt_token_ids + choice.token_ids + closing
        assert r2.prompt_token_ids[: len(history)] == history
        assert r2.prompt_token_ids[len(history) :] == encode(
            tok, "<|im_start|>user\nand?<|im_end|>\n<|im_start|>assistant\n"
        )


async def test_dict_and_object_feedback_mix_and_unknown_conversations(path, tool_case):
    r1, r2, messages = await tool_turns(path, tool_case)  # turn 1 fed back as the SDK object
    as_dict = {"role": "assistant", "content": r2.choices[0].message.content}
    third = [*messages, as_dict, {"role": "user", "content": "Thanks!"}]
    r3 = await path.client.chat.completions.create(
        model="tiny-tool", messages=third, tools=tool_case.tools, temperature=0.0, max_tokens=4
    )
    history = r2.prompt_token_ids + r2.choices[0].token_ids
    assert r3.prompt_token_ids[: len(history)] == history
    if path.name == "in_process":
        assert path.client.measure_drift([*third, r3.choices[0].message]) == (0, 0)
        assert path.client.measure_drift([{"role": "user", "content": "never sent"}]) is None


async def test_tool_call_ids_are_stable_and_tool_choice_none_keeps_text(path, tool_case):
    first, second = [
        await path.client.chat.completions.create(
            model="tiny-tool", messages=tool_case.prompt, tools=tool_case.tools, temperature=0.0
        )
        for _ in range(2)
    ]
    assert first.choices[0].message.tool_calls[0].id == second.choices[0].message.tool_calls[0].id
    plain = await path.client.chat.completions.create(
        model="tiny-tool",
        messages=tool_case.prompt,
        tools=tool_case.tools,
        tool_choice="none",
        temperature=0.0,
    )
    assert plain.choices[0].message.tool_calls is None
    assert plain.choices[0].message.content == tool_case.call_text
    assert plain.choices[0].finish_reason == "stop"


async def test_completions_and_models(path):
    tok = path.tokenizer
    by_text = await path.client.completions.create(
        model="tiny-tool", prompt="Hello", max_tokens=4, temperature=0.0
    )
    ids = encode(tok, "Hello")
    assert by_text.prompt_token_ids == ids and len(by_text.choices[0].token_ids) <= 4
    by_ids = await path.client.completions.create(
        model="tiny-tool", prompt=ids, max_tokens=4, temperature=0.0
    )
    assert by_ids.prompt_token_ids == ids and by_ids.choices[0].token_ids == by_text.choices[0].token_ids
    assert len(by_ids.choices[0].token_logprobs) == len(by_ids.choices[0].token_ids)
    assert [m.id for m in (await path.client.models.list()).data] == ["tiny-tool"]


async def test_logprob_tokens_spell_the_sample(path, tool_case):
    r = await path.client.chat.completions.create(
        model="tiny-tool", messages=tool_case.prompt, tools=tool_case.tools, temperature=0.0, logprobs=True
    )
    tokens = [entry.token for entry in r.choices[0].logprobs.content]
    assert "".join(tokens) == tool_case.call_text + "<|im_end|>"


@pytest.mark.parametrize("transport", ["in_process", "http"])
async def test_engine_failures_map_to_sdk_errors(transport, tool_model):
    from bridges.adapters.hf import HFEngine
    from bridges.client import EngineClient
    from bridges.server.app import serve_in_thread

    model, tokenizer = tool_model
    slow = EngineClient(HFEngine(model, tokenizer), model_name="tiny-tool", request_timeout=1e-4)
    closed_engine = HFEngine(model, tokenizer)
    closed_engine.close()
    closed = EngineClient(closed_engine, model_name="tiny-tool")
    messages = [{"role": "user", "content": "hi"}]
    if transport == "in_process":
        with pytest.raises(openai.APITimeoutError):
            await slow.chat.completions.create(model="tiny-tool", messages=messages, max_tokens=64)
        with pytest.raises(openai.InternalServerError, match="closed"):
            await closed.chat.completions.create(model="tiny-tool", messages=messages)
        return
    with serve_in_thread(slow) as slow_server, serve_in_thread(closed) as closed_server:
        for server, status, cause in ((slow_server, 504, "did not answer"), (closed_server, 500, "closed")):
            sdk = openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
            with pytest.raises(openai.APIStatusError) as info:
                await sdk.chat.completions.create(model="tiny-tool", messages=messages, max_tokens=64)
            assert info.value.status_code == status and cause in info.value.message
