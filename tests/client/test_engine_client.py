"""EngineClient as an AsyncOpenAI: argument mapping, refusals, errors, response extras, completions."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletion

from bridges.client import EngineClient, UnsupportedEndpointError
from bridges.runtime.errors import EngineError, PromptTooLongError

USER = [{"role": "user", "content": "What is 2+3?"}]
ADD_TOOL = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}


async def test_is_a_real_async_openai_with_served_resources(make_client):
    client, _ = make_client(["Five."])
    assert isinstance(client, openai.AsyncOpenAI)
    r = await client.chat.completions.create(model="policy", messages=USER)
    assert isinstance(r, ChatCompletion)
    assert r.model == "policy" and r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.usage.prompt_tokens == len(r.prompt_token_ids)
    assert r.usage.completion_tokens == len(r.choices[0].token_ids)
    page = await client.models.list()
    assert [m.id for m in page.data] == ["bridges"]
    assert [m.id async for m in client.models.list()] == ["bridges"]
    assert (await client.models.retrieve("bridges")).owned_by == "scripted"


async def test_other_endpoints_fail_with_one_sentence(make_client):
    client, _ = make_client()
    with pytest.raises(UnsupportedEndpointError, match=r"POST /v1/embeddings is not available"):
        await client.embeddings.create(model="m", input="x")


async def test_sampling_arguments_reach_the_engine(make_client):
    client, engine = make_client(["ok"])
    await client.chat.completions.create(
        model="m",
        messages=USER,
        max_tokens=50,
        max_completion_tokens=20,
        temperature=0.7,
        top_p=0.9,
        stop=["\n\n", "END"],
        seed=11,
        n=2,
        extra_body={"top_k": 5, "stop_token_ids": [7], "return_token_ids": True},
        user="u",
        metadata={"k": "v"},
        store=False,
        stream=False,
        parallel_tool_calls=True,
        presence_penalty=0,
        frequency_penalty=0.0,
        top_logprobs=0,
        response_format=openai.NOT_GIVEN,
        logit_bias=openai.omit,
    )
    call = engine.calls[-1]
    params = call.params
    assert call.n == 2
    assert (params.max_tokens, params.temperature, params.top_p, params.seed) == (20, 0.7, 0.9, 11)
    assert (params.stop, params.top_k, params.stop_token_ids) == (["\n\n", "END"], 5, [7])


async def test_integral_floats_are_integers_and_prompt_ids_stay_inside_the_vocabulary(make_client):
    """JSON does not tell 2 from 2.0 (nor does JSON Schema's integer, which bridges.serve documents)."""
    client, engine = make_client(["ok"])
    await client.chat.completions.create(model="m", messages=USER, n=2.0, max_tokens=5.0, seed=3.0,
                                         extra_body={"top_k": 4.0, "stop_token_ids": [7.0]})
    params = engine.calls[-1].params
    assert (engine.calls[-1].n, params.max_tokens, params.seed, params.top_k, params.stop_token_ids) == (2, 5, 3, 4, [7])
    assert all(type(v) is int for v in (params.max_tokens, params.seed, params.top_k, *params.stop_token_ids))
    await client.completions.create(model="m", prompt=[5.0, 6.0], max_tokens=2)
    assert engine.calls[-1].prompt_ids == [5, 6]
    for bad in ([5, len(client.engine.tokenizer)], [-1], [2.5]):
        with pytest.raises(openai.BadRequestError, match="prompt"):
            await client.completions.create(model="m", prompt=bad, max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="'n' must be an integer"):
        await client.chat.completions.create(model="m", messages=USER, n=2.5)


async def test_max_tokens_defaults_to_the_rest_of_the_context_window(make_client):
    client, engine = make_client(["ok"], engine_kwargs={"max_model_len": 100})
    r = await client.chat.completions.create(model="m", messages=USER)
    assert engine.calls[-1].params.max_tokens == 100 - len(r.prompt_token_ids)
    await client.chat.completions.create(model="m", messages=USER, max_tokens=1000)
    assert engine.calls[-1].params.max_tokens == 100 - len(r.prompt_token_ids)  # clamped to the window


async def test_an_engine_without_alternatives_refuses_top_logprobs_in_one_sentence(make_client):
    client, engine = make_client()  # the scripted engine, like Tinker's or verl's, returns no alternatives
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(model="m", messages=USER, logprobs=True, top_logprobs=2)
    assert (
        info.value.message
        == "the 'scripted' engine returned no top_logprobs, so it cannot serve them; drop top_logprobs."
    )
    assert info.value.param == "top_logprobs"
    with pytest.raises(openai.BadRequestError) as info:
        await client.completions.create(model="m", prompt="hi", logprobs=2)
    assert info.value.param == "logprobs"


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"stream": "yes"}, "stream"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"stream": True, "stream_options": {"include_usage": 1}}, "stream_options.include_usage"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"frequency_penalty": -1.0}, "frequency_penalty"),
        ({"logit_bias": {"5": 10}}, "logit_bias"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
        ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),  # without logprobs=True
        ({"tool_choice": "required"}, "tool_choice"),  # no tools to call
        ({"tool_choice": "sometimes", "tools": [ADD_TOOL]}, "tool_choice"),
        (
            {"tool_choice": {"type": "function", "function": {"name": "mul"}}, "tools": [ADD_TOOL]},
            "tool_choice",
        ),
        ({"extra_body": {"repetition_penalty": 1.1}}, "repetition_penalty"),
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"n": 0}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stop": [""]}, "stop"),
        ({"store": True}, "store"),
        ({"service_tier": "flex"}, "service_tier"),
    ],
)
async def test_arguments_the_engine_cannot_honour_are_refused_by_name(make_client, kwargs, param):
    client, engine = make_client()
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(model="m", messages=USER, **kwargs)
    assert f"'{param}'" in info.value.message
    assert info.value.param == param and info.value.status_code == 400
    assert engine.calls == []  # refused before anything ran


async def test_unknown_keyword_is_a_type_error_like_the_sdk(make_client):
    client, _ = make_client()
    with pytest.raises(TypeError, match="unexpected keyword argument 'temprature'"):
        await client.chat.completions.create(model="m", messages=USER, temprature=0.5)
    with pytest.raises(TypeError, match="'model'"):
        await client.chat.completions.create(messages=USER)
    # each endpoint's required argument is an unknown keyword on the other one
    with pytest.raises(TypeError, match="unexpected keyword argument 'prompt'"):
        await client.chat.completions.create(model="m", messages=USER, prompt="hi")
    with pytest.raises(TypeError, match="unexpected keyword argument 'messages'"):
        await client.completions.create(model="m", prompt="hi", messages=USER)


async def test_bad_messages_are_bad_requests(make_client):
    client, _ = make_client()
    cases = [
        ([], "messages"),
        ("hello", "messages"),
        ([{"content": "no role"}], "messages[0].role"),
        ([{"role": "user", "content": "ok"}, {"role": "robot", "content": "x"}], "messages[1].role"),
        ([{"role": "user", "content": {"text": "a dict"}}], "messages[0].content"),
    ]
    for messages, param in cases:
        with pytest.raises(openai.BadRequestError) as info:
            await client.chat.completions.create(model="m", messages=messages)
        assert info.value.param == param


async def test_prompt_too_long_has_its_code(make_client):
    client, engine = make_client(engine_kwargs={"max_model_len": 32})
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x" * 40}])
    assert info.value.code == "prompt_too_long" and "context window is 32" in info.value.message
    assert engine.calls == []
    engine.fail_with = PromptTooLongError("the prompt does not fit.")
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(model="m", messages=USER)
    assert info.value.code == "prompt_too_long"


async def test_engine_timeout_and_failures_map_to_sdk_errors(make_client):
    client, engine = make_client(engine_kwargs={"delay": 0.5}, request_timeout=0.05)
    with pytest.raises(openai.APITimeoutError, match="did not answer within 0.05 s"):
        await client.chat.completions.create(model="m", messages=USER)
    client, engine = make_client(engine_kwargs={"delay": 0.5})
    with pytest.raises(openai.APITimeoutError):
        await client.chat.completions.create(model="m", messages=USER, timeout=0.05)
    slow = client.with_options(timeout=0.05)
    assert slow.ledger is client.ledger and slow.engine is client.engine
    with pytest.raises(openai.APITimeoutError):
        await slow.chat.completions.create(model="m", messages=USER)
    engine.delay = 0.0
    engine.fail_with = EngineError("CUDA out of memory")
    with pytest.raises(openai.InternalServerError, match="CUDA out of memory"):
        await client.chat.completions.create(model="m", messages=USER)
    engine.fail_with = RuntimeError("boom")
    with pytest.raises(openai.InternalServerError, match="RuntimeError: boom"):
        await client.chat.completions.create(model="m", messages=USER)


async def test_aborted_sample_is_an_engine_error(make_client):
    client, engine = make_client(["ok"])
    original = engine._sample

    def aborted(text, params):
        sample = original(text, params)
        sample.finish_reason = "abort"
        return sample

    engine._sample = aborted
    with pytest.raises(openai.InternalServerError, match="aborted"):
        await client.chat.completions.create(model="m", messages=USER)


async def test_logprobs_and_extras_line_up_with_token_ids(make_client, tok):
    client, engine = make_client(["<think>2+3</think>It is 5."], engine_kwargs={"weight_version": 7})
    r = await client.chat.completions.create(model="m", messages=USER, logprobs=True)
    choice = r.choices[0]
    assert len(choice.logprobs.content) == len(choice.token_ids) == len(choice.token_logprobs)
    assert [e.logprob for e in choice.logprobs.content] == choice.token_logprobs
    assert "".join(e.token for e in choice.logprobs.content) == "<think>2+3</think>It is 5.<|im_end|>"
    assert choice.message.reasoning_content == "2+3" and choice.message.content == "It is 5."
    assert r.weight_version == 7
    plain = await client.chat.completions.create(model="m", messages=USER)
    assert plain.choices[0].logprobs is None and len(plain.choices[0].token_logprobs) == len(
        plain.choices[0].token_ids
    )


async def test_unclosed_think_is_all_reasoning(make_client):
    client, _ = make_client(["<think>still thinking about"])
    r = await client.chat.completions.create(model="m", messages=USER, max_tokens=10)
    assert r.choices[0].finish_reason == "length"
    assert r.choices[0].message.reasoning_content == "still thi" and r.choices[0].message.content == ""


async def test_tool_calls_parsed_only_when_tools_are_offered(make_client):
    text = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    client, _ = make_client([text])
    r = await client.chat.completions.create(model="m", messages=USER, tools=[ADD_TOOL])
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 2, "b": 3}
    again = await client.chat.completions.create(model="m", messages=USER, tools=[ADD_TOOL])
    assert again.choices[0].message.tool_calls[0].id == call.id  # same sample -> same id
    for kwargs in ({}, {"tools": [ADD_TOOL], "tool_choice": "none"}):
        r = await client.chat.completions.create(model="m", messages=USER, **kwargs)
        assert r.choices[0].message.tool_calls is None and r.choices[0].message.content == text
        assert r.choices[0].finish_reason == "stop"


async def test_llama3_parser_is_selectable(make_client):
    client, _ = make_client(['{"name": "add", "parameters": {"a": 1}}'], tool_parser="llama3_json")
    r = await client.chat.completions.create(model="m", messages=USER, tools=[ADD_TOOL])
    assert r.choices[0].message.tool_calls[0].function.name == "add"
    with pytest.raises(ValueError, match="unknown tool_parser"):
        make_client(tool_parser="xml")


async def test_stop_token_id_is_not_shown_in_content(make_client, tok):
    marker = tok.convert_tokens_to_ids("</tool_call>")
    client, _ = make_client(["abc</tool_call>def"])
    r = await client.chat.completions.create(
        model="m", messages=USER, extra_body={"stop_token_ids": [marker]}
    )
    assert r.choices[0].token_ids[-1] == marker and r.choices[0].message.content == "abc"


async def test_completions_with_text_and_token_prompts(make_client, tok):
    client, engine = make_client(["continued text that is long"])
    r = await client.completions.create(model="m", prompt="Once upon")
    assert r.prompt_token_ids == tok.backend_tokenizer.encode("Once upon", add_special_tokens=False).ids
    assert engine.calls[-1].params.max_tokens == 16 and r.choices[0].finish_reason == "length"
    assert r.choices[0].text == "continued text t" and len(r.choices[0].token_ids) == 16
    r = await client.completions.create(model="m", prompt=[5, 6, 7], max_tokens=40, logprobs=0, stop=["text"])
    choice = r.choices[0]
    assert r.prompt_token_ids == [5, 6, 7] and engine.calls[-1].prompt_ids == [5, 6, 7]
    assert choice.text == "continued " and choice.finish_reason == "stop"
    assert len(choice.logprobs.tokens) == len(choice.token_ids) == len(choice.logprobs.token_logprobs)
    for kwargs, param in (
        ({"logprobs": 2}, "logprobs"),
        ({"echo": True}, "echo"),
        ({"suffix": "x"}, "suffix"),
        ({"best_of": 3}, "best_of"),
    ):
        with pytest.raises(openai.BadRequestError) as info:
            await client.completions.create(model="m", prompt="x", **kwargs)
        assert info.value.param == param
    with pytest.raises(openai.BadRequestError, match="batched prompts are not supported"):
        await client.completions.create(model="m", prompt=["a", "b"])


async def test_concurrent_calls_are_independent(make_client):
    client, _ = make_client(lambda prompt, i: f"answer {i}", engine_kwargs={"delay": 0.01})
    results = await asyncio.gather(
        *(
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"q{i}"}])
            for i in range(16)
        )
    )
    assert len({r.id for r in results}) == 16
    assert sorted(r.choices[0].message.content for r in results) == sorted(f"answer {i}" for i in range(16))


def test_constructor_validates(make_engine: Any):
    with pytest.raises(ValueError, match="request_timeout must be positive"):
        EngineClient(make_engine(), request_timeout=0)
    with pytest.raises(ValueError, match="ledger_capacity must be at least 1"):
        EngineClient(make_engine(), ledger_capacity=0)


async def test_a_timed_out_call_leaves_the_task_usable_and_outer_cancel_propagates(make_client):
    client, engine = make_client(["ok"], engine_kwargs={"delay": 0.5}, request_timeout=0.05)
    with pytest.raises(openai.APITimeoutError):
        await client.chat.completions.create(model="m", messages=USER)
    assert asyncio.current_task().cancelling() == 0  # no cancellation left pending on the caller
    engine.delay = 0.0
    r = await client.chat.completions.create(model="m", messages=USER)
    assert r.choices[0].message.content == "ok"
    engine.delay = 0.5
    client.request_timeout = 5.0
    task = asyncio.create_task(client.chat.completions.create(model="m", messages=USER))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task  # a cancellation from outside is not turned into a timeout


async def test_post_as_verifiers_calls_it_answers_what_the_sdk_route_answers(make_client):
    """``client.post(path, body=..., cast_to=httpx.Response)`` skips the SDK's HTTP plumbing; the
    caller must not be able to tell: the same JSON, the same status, the same errors."""
    import httpx
    import openai

    client, _ = make_client(["The answer is 4."])
    body = {"model": "m", "messages": [{"role": "user", "content": "2+2?"}], "max_tokens": 32,
            "logprobs": True, "return_token_ids": True}
    fast = await client.post("/chat/completions", body=body, cast_to=httpx.Response, options={})
    routed = await openai.AsyncOpenAI.post(client, "/chat/completions", body=body, cast_to=httpx.Response)
    assert fast.status_code == routed.status_code == 200
    assert fast.headers["content-type"].startswith("application/json")
    one, two = fast.json(), routed.json()
    assert one.keys() == two.keys() and one["id"] != two["id"]
    for key in ("id", "created"):
        one.pop(key), two.pop(key)
    assert one == two  # choices, logprobs, token ids, usage, extras: identical
    text = await client.post("/completions", body={"model": "m", "prompt": "2+2=", "max_tokens": 4},
                             cast_to=httpx.Response, options={"timeout": 5.0})
    assert text.json()["choices"][0]["text"]
    for bad in ({"model": "m", "messages": []}, {"messages": [{"role": "user", "content": "x"}]},
                {"model": "m", "messages": [{"role": "user", "content": "x"}], "bogus": 1}):
        with pytest.raises(openai.BadRequestError):
            await client.post("/chat/completions", body=bad, cast_to=httpx.Response, options={})
    with pytest.raises(UnsupportedEndpointError, match="serves only chat completions"):
        await client.post("/embeddings", body={"model": "m", "input": "x"}, cast_to=httpx.Response)
    streamed = await client.post("/chat/completions", body={**body, "stream": True}, cast_to=httpx.Response)
    assert streamed.headers["content-type"].startswith("text/event-stream")  # the transport's events
    assert streamed.text.rstrip().endswith("data: [DONE]")


MUL_TOOL = {"type": "function", "function": {"name": "mul", "parameters": {"type": "object"}}}
NAMED_ADD = {"type": "function", "function": {"name": "add"}}


@pytest.mark.parametrize(
    ("reply", "arguments"),
    [
        ('{"a": 2, "b": 3}}\n</tool_call>', '{"a": 2, "b": 3}'),  # well-formed: parsed
        ('{"a": 2, b}}\n</tool_call>', '{"a": 2, b}'),  # broken JSON: what the model wrote, no markup
        ('{"a": 2, b', '{"a": 2, b'),  # cut short: kept as written
        ("oops", "oops"),
    ],
)
async def test_a_named_tool_choice_is_a_call_to_it_holding_only_what_the_model_wrote(
    make_client, reply, arguments
):
    """The opener names the function and is ours: the call never carries it (LangChain parses these)."""
    client, _ = make_client([reply])
    r = await client.chat.completions.create(
        model="m", messages=USER, tools=[ADD_TOOL, MUL_TOOL], tool_choice=NAMED_ADD
    )
    [call] = r.choices[0].message.tool_calls
    assert call.function.name == "add" and call.function.arguments == arguments
    assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.content is None


async def test_required_with_one_tool_names_it_and_with_several_the_model_does(make_client, tok):
    """One declared tool: the only call allowed, so its name is prefilled (the OpenAI Agents SDK
    raised "Tool not found" on a call named ""). Several: the model's own choice, parsed."""
    client, engine = make_client(['{"a": 1}}\n</tool_call>'])
    r = await client.chat.completions.create(
        model="m", messages=USER, tools=[ADD_TOOL], tool_choice="required"
    )
    [call] = r.choices[0].message.tool_calls
    assert (call.function.name, call.function.arguments) == ("add", '{"a": 1}')
    assert tok.decode(r.prompt_token_ids).endswith('<tool_call>\n{"name": "add", "arguments": ')
    client, _ = make_client(['mul", "arguments": {"a": 1}}\n</tool_call>'])
    r = await client.chat.completions.create(
        model="m", messages=USER, tools=[ADD_TOOL, MUL_TOOL], tool_choice="required"
    )
    [call] = r.choices[0].message.tool_calls
    assert (call.function.name, call.function.arguments) == ("mul", '{"a": 1}')


async def test_required_among_several_tools_draws_a_reply_naming_an_undeclared_tool_again(make_client, tok):
    """The policy's own tokens and logprobs, never a masked distribution: an undeclared name is drawn
    again (seeded requests with a new seed each time), up to REDRAWS times; after that the client
    names a declared tool itself, prefilled as a named tool_choice is, and the model writes the rest."""
    from bridges.client.redraw import REDRAWS, SEED_STRIDE

    wrong, right = 'zzz", "arguments": {}}\n</tool_call>', 'mul", "arguments": {"a": 1}}\n</tool_call>'
    client, engine = make_client([wrong, "garbage", right])
    r = await client.chat.completions.create(
        model="m", messages=USER, tools=[ADD_TOOL, MUL_TOOL], tool_choice="required", seed=5
    )
    assert [c.function.name for c in r.choices[0].message.tool_calls] == ["mul"]
    assert [c.params.seed for c in engine.calls] == [5, 5 + SEED_STRIDE, 5 + 2 * SEED_STRIDE]
    assert tok.decode(r.choices[0].token_ids).startswith('mul", "arguments"')  # the kept draw's own ids
    client, engine = make_client([wrong] * (1 + REDRAWS) + ['{"a": 2}}\n</tool_call>'])
    r = await client.chat.completions.create(model="m", messages=USER, tools=[ADD_TOOL, MUL_TOOL], tool_choice="required")
    [call] = r.choices[0].message.tool_calls  # every draw named 'zzz': the client names a declared tool itself
    assert call.function.name in ("add", "mul") and call.function.arguments == '{"a": 2}' and len(engine.calls) == 2 + REDRAWS
    assert tok.decode(r.prompt_token_ids).endswith(f'<tool_call>\n{{"name": "{call.function.name}", "arguments": ')
