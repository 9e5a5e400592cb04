"""Streaming, ``top_logprobs`` and ``tool_choice``: the parts of the OpenAI face agent code leans on.

Run on both client paths (``path``: ``EngineClient`` in-process, or the stock SDK against
``bridges.serve``), over the tiny model fine-tuned to call ``add``; nothing here knows which path.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from bridges.envs.messages import to_message_dicts

GREEDY: dict[str, Any] = {"temperature": 0.0, "max_tokens": 64}


async def assemble(stream: Any) -> tuple[dict[str, Any], list[Any]]:
    """What a streaming agent builds from the deltas: the assistant message, and every chunk."""
    message: dict[str, Any] = {"role": "assistant", "content": ""}
    calls: dict[int, dict[str, Any]] = {}
    chunks = [chunk async for chunk in stream]
    for chunk in chunks:
        for choice in chunk.choices:
            delta = choice.delta
            message["content"] += delta.content or ""
            for call in delta.tool_calls or []:
                slot = calls.setdefault(
                    call.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
                )
                slot["id"] += call.id or ""
                slot["function"]["name"] += call.function.name or ""
                slot["function"]["arguments"] += call.function.arguments or ""
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message, chunks


async def test_streamed_chat_is_the_whole_response_cut_into_chunks(path, tool_case):
    create = path.client.chat.completions.create
    whole = await create(model="tiny-tool", messages=tool_case.prompt, tools=tool_case.tools, **GREEDY)
    stream = await create(
        model="tiny-tool", messages=tool_case.prompt, tools=tool_case.tools, stream=True,
        stream_options={"include_usage": True}, **GREEDY,
    )
    message, chunks = await assemble(stream)
    assert type(chunks[0]).__name__ == "ChatCompletionChunk"
    assert chunks[0].choices[0].delta.role == "assistant"
    [call] = whole.choices[0].message.tool_calls
    assert message["tool_calls"] == [call.model_dump(exclude_none=True)]
    assert message["content"] == ""  # the markup became the tool call, as in the whole response
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason][0]
    assert finish.choices[0].finish_reason == "tool_calls"
    assert finish.choices[0].token_ids == whole.choices[0].token_ids
    assert finish.choices[0].token_logprobs == pytest.approx(whole.choices[0].token_logprobs)
    last = chunks[-1]
    assert last.choices == [] and last.usage == whole.usage  # include_usage: a last chunk with usage only
    assert last.prompt_token_ids == whole.prompt_token_ids and isinstance(last.weight_version, int)
    assert all(c.usage is None for c in chunks[:-1])


async def test_a_streamed_conversation_enters_the_ledger_exactly_as_a_whole_one(path, tool_case):
    """Two turns with a tool result between: streamed and not, the second prompt's ids are the same."""
    create = path.client.chat.completions.create
    prompts = []
    for stream in (False, True):
        first = await create(model="tiny-tool", messages=tool_case.prompt, tools=tool_case.tools,
                             stream=stream, **GREEDY)
        if stream:
            reply, _ = await assemble(first)
        else:
            reply = first.choices[0].message.model_dump(exclude_none=True)
        messages = [
            *tool_case.prompt,
            reply,
            {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": "5"},
        ]
        second = await create(model="tiny-tool", messages=messages, tools=tool_case.tools, stream=stream,
                              extra_body={"return_drift": True}, **GREEDY)
        if stream:
            answer, chunks = await assemble(second)
            assert answer["content"] == tool_case.answer
            prompts.append((chunks[-1].prompt_token_ids, chunks[-1].drift_tokens))
        else:
            prompts.append((second.prompt_token_ids, second.drift_tokens))
    assert prompts[0] == prompts[1]
    assert prompts[0][1] == 0


async def test_streamed_completion(path):
    create = path.client.completions.create
    whole = await create(model="tiny-tool", prompt="What is", max_tokens=8, temperature=0.0)
    stream = await create(model="tiny-tool", prompt="What is", max_tokens=8, temperature=0.0, stream=True,
                          stream_options={"include_usage": True})
    chunks = [c async for c in stream]
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-2].choices[0].finish_reason == whole.choices[0].finish_reason
    assert chunks[-2].choices[0].token_ids == whole.choices[0].token_ids
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


async def test_top_logprobs_rank_the_distribution_the_token_was_drawn_from(path, tool_case):
    def ask(k: int, temperature: float, **kwargs: Any) -> Any:
        return path.client.chat.completions.create(model="tiny-tool", messages=tool_case.prompt, logprobs=True,
                                                   top_logprobs=k, temperature=temperature, max_tokens=6, **kwargs)

    r = await ask(5, 0.0)
    entries = r.choices[0].logprobs.content
    assert len(entries) == len(r.choices[0].token_ids)
    for entry in entries:
        values = [t.logprob for t in entry.top_logprobs]
        assert len(values) == 5 and values == sorted(values, reverse=True)
        assert entry.top_logprobs[0].token == entry.token  # greedy: the sampled token ranks first
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob, abs=1e-5)
        assert math.fsum(math.exp(v) for v in values) <= 1.0 + 1e-5
    sampled = await ask(20, 1.0, seed=3)
    for entry in sampled.choices[0].logprobs.content:
        listed = {t.token: t.logprob for t in entry.top_logprobs}
        assert len(entry.top_logprobs) == 20
        if entry.token in listed:  # the same distribution: the sampled id shows the same number
            assert listed[entry.token] == pytest.approx(entry.logprob, abs=1e-5)
    completion = await path.client.completions.create(
        model="tiny-tool", prompt="What is", max_tokens=4, temperature=0.0, logprobs=3
    )
    tops = completion.choices[0].logprobs.top_logprobs
    assert len(tops) == 4 and all(len(t) == 3 for t in tops)


async def test_tool_choice_none_leaves_the_markup_as_text(path, tool_case):
    r = await path.client.chat.completions.create(
        model="tiny-tool", messages=tool_case.prompt, tools=tool_case.tools, tool_choice="none", **GREEDY
    )
    assert r.choices[0].message.tool_calls is None
    assert r.choices[0].message.content == tool_case.call_text and r.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "add"}}])
async def test_forced_tool_choice_prefills_the_opener_into_the_prompt(path, tool_case, choice):
    """The opener is prompt (mask 0), the call is OpenAI-shaped, and the next turn extends it exactly.
    With one declared tool, ``required`` prefills its name as a named choice does."""
    tok = path.tokenizer
    create = path.client.chat.completions.create
    free = await create(model="tiny-tool", messages=tool_case.prompt, tools=tool_case.tools, **GREEDY)
    r = await create(
        model="tiny-tool", messages=tool_case.prompt, tools=tool_case.tools, tool_choice=choice, **GREEDY
    )
    opener = '<tool_call>\n{"name": "add", "arguments": '  # one declared tool: required names it too
    opener_ids = tok.backend_tokenizer.encode(opener, add_special_tokens=False).ids
    assert r.prompt_token_ids == free.prompt_token_ids + opener_ids
    [call] = r.choices[0].message.tool_calls
    assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 2, "b": 3}
    assert r.choices[0].finish_reason == "tool_calls"
    messages = [
        *tool_case.prompt,
        r.choices[0].message,
        {"role": "tool", "tool_call_id": call.id, "content": "5"},
    ]
    r2 = await create(
        model="tiny-tool",
        messages=messages,
        tools=tool_case.tools,
        extra_body={"return_drift": True},
        **GREEDY,
    )
    history = r.prompt_token_ids + r.choices[0].token_ids
    assert r2.prompt_token_ids[: len(history)] == history
    assert r2.choices[0].message.content == tool_case.answer
    # the fine-tuned model writes the call exactly as the template renders it: nothing drifts
    assert (
        r2.prompt_token_ids
        == tok.apply_chat_template(
            to_message_dicts(messages), tools=tool_case.tools, add_generation_prompt=True
        )["input_ids"]
    )
    assert r2.drift_tokens == 0
