"""The token ledger (docs/design.md §2) through EngineClient, on real tiny-tokenizer ids."""

from __future__ import annotations

import asyncio
from typing import Any

from bridges.client.ledger import LedgerRecord, TokenLedger, message_key, prefix_hashes
from bridges.envs.messages import to_message_dicts

USER = {"role": "user", "content": "What is 2+3?"}


def ids_of(tok: Any, text: str) -> list[int]:
    return tok.backend_tokenizer.encode(text, add_special_tokens=False).ids


def full_render(tok: Any, messages: list[Any], tools: Any = None) -> list[int]:
    """The reference render: transformers' own template call on plain dicts (it cannot read SDK objects)."""
    return tok.apply_chat_template(
        to_message_dicts(messages), tools=tools, tokenize=True, add_generation_prompt=True
    )["input_ids"]


async def test_second_turn_extends_first_exactly(make_client, tok):
    client, engine = make_client(["The answer is 5.", "Yes."])
    r1 = await client.chat.completions.create(model="m", messages=[USER])
    assert r1.prompt_token_ids == full_render(tok, [USER])
    sampled = r1.choices[0].token_ids
    assert sampled[-1] == tok.eos_token_id  # the engine emitted <|im_end|>
    messages = [
        USER,
        {"role": "assistant", "content": r1.choices[0].message.content},
        {"role": "user", "content": "Sure?"},
    ]
    r2 = await client.chat.completions.create(model="m", messages=messages)
    expected = (
        r1.prompt_token_ids
        + sampled
        + ids_of(tok, "\n")  # the template's end of turn the engine did not emit
        + ids_of(tok, "<|im_start|>user\nSure?<|im_end|>\n<|im_start|>assistant\n")
    )
    assert r2.prompt_token_ids == expected
    assert engine.calls[1].prompt_ids == expected
    assert r2.prompt_token_ids == full_render(tok, messages)  # the bundled template: zero drift
    assert client.measure_drift([*messages, r2.choices[0].message]) == (0, 0)


async def test_sdk_message_object_and_dict_extend_the_same_ledger(make_client):
    client, _ = make_client(["<think>hmm</think>Five.", "ok", "ok"])
    r1 = await client.chat.completions.create(model="m", messages=[USER])
    message = r1.choices[0].message
    assert message.reasoning_content == "hmm" and message.content == "Five."
    follow = {"role": "user", "content": "and?"}
    as_object = await client.chat.completions.create(model="m", messages=[USER, message, follow])
    as_dict = {"role": "assistant", "content": "Five.", "tool_calls": None, "refusal": None}
    via_dict = await client.chat.completions.create(model="m", messages=[USER, as_dict, follow])
    history = r1.prompt_token_ids + r1.choices[0].token_ids
    assert as_object.prompt_token_ids[: len(history)] == history
    assert via_dict.prompt_token_ids == as_object.prompt_token_ids
    # the object carries reasoning_content, so a from-scratch render reproduces the <think> block
    assert client.measure_drift([USER, message, follow, as_object.choices[0].message]) == (0, 0)


async def test_n_samples_branch_into_separate_ledgers(make_client, tok):
    client, _ = make_client(["red", "blue", "A", "B"])
    r1 = await client.chat.completions.create(model="m", messages=[USER], n=2)
    assert [c.message.content for c in r1.choices] == ["red", "blue"]
    follow = {"role": "user", "content": "why?"}
    prompts = []
    for choice in r1.choices:
        r2 = await client.chat.completions.create(model="m", messages=[USER, choice.message, follow])
        history = r1.prompt_token_ids + choice.token_ids + ids_of(tok, "\n")
        assert r2.prompt_token_ids[: len(history)] == history
        prompts.append(r2.prompt_token_ids)
    assert prompts[0] != prompts[1]
    assert len(client.ledger) == 4  # 2 first-turn branches + 1 second turn on each


async def test_length_truncated_turn_is_closed_not_spliced(make_client, tok):
    client, _ = make_client(["a long answer that will be cut", "ok"])
    r1 = await client.chat.completions.create(model="m", messages=[USER], max_tokens=6)
    choice = r1.choices[0]
    assert choice.finish_reason == "length"
    assert choice.token_ids == ids_of(tok, "a long") and choice.message.content == "a long"
    follow = {"role": "user", "content": "go on"}
    r2 = await client.chat.completions.create(model="m", messages=[USER, choice.message, follow])
    closing = ids_of(tok, "<|im_end|>\n")
    new = ids_of(tok, "<|im_start|>user\ngo on<|im_end|>\n<|im_start|>assistant\n")
    assert r2.prompt_token_ids == r1.prompt_token_ids + choice.token_ids + closing + new


async def test_stop_string_turn_content_is_cut_and_turn_closed(make_client, tok):
    client, _ = make_client(["Result: 5 END trailing", "ok"])
    r1 = await client.chat.completions.create(model="m", messages=[USER], stop="END")
    choice = r1.choices[0]
    assert choice.finish_reason == "stop" and choice.message.content == "Result: 5 "
    assert choice.token_ids == ids_of(tok, "Result: 5 END")  # the ids stay exactly as sampled
    r2 = await client.chat.completions.create(
        model="m", messages=[USER, choice.message, {"role": "user", "content": "more"}]
    )
    history = r1.prompt_token_ids + choice.token_ids + ids_of(tok, "<|im_end|>\n")
    assert r2.prompt_token_ids[: len(history)] == history
    # the stop string was sampled but is not in the message: a from-scratch render differs (drift)
    drift_tokens, drifted_turns = client.measure_drift(
        [USER, choice.message, {"role": "user", "content": "more"}, r2.choices[0].message]
    )
    assert drifted_turns == 1 and drift_tokens > 0


async def test_unknown_prefix_is_rendered_fresh(make_client, tok):
    client, _ = make_client(["Five.", "ok"])
    await client.chat.completions.create(model="m", messages=[USER])
    edited = [USER, {"role": "assistant", "content": "Six."}, {"role": "user", "content": "sure?"}]
    r2 = await client.chat.completions.create(model="m", messages=edited)
    assert r2.prompt_token_ids == full_render(tok, edited)
    assert client.measure_drift([*edited[:2]]) is None  # never produced by this client
    assert client.measure_drift([{"role": "user", "content": "never seen"}]) is None


async def test_different_tools_do_not_extend(make_client, tok):
    client, _ = make_client(["Five.", "ok"])
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    r1 = await client.chat.completions.create(model="m", messages=[USER], tools=tools)
    follow = [USER, r1.choices[0].message, {"role": "user", "content": "again"}]
    r2 = await client.chat.completions.create(model="m", messages=follow)  # no tools this time
    assert r2.prompt_token_ids == full_render(tok, follow)
    assert r2.prompt_token_ids[:5] != r1.prompt_token_ids[:5]


async def test_tools_mutated_in_place_are_noticed(make_client, tok):
    client, _ = make_client(["Five.", "ok", "ok"])
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    r1 = await client.chat.completions.create(model="m", messages=[USER], tools=tools)
    follow = [USER, r1.choices[0].message, {"role": "user", "content": "again"}]
    tools[0]["function"]["name"] = "plus"  # same list object, different schema
    r2 = await client.chat.completions.create(model="m", messages=follow, tools=tools)
    assert r2.prompt_token_ids == full_render(tok, follow, tools)
    assert "plus" in tok.decode(r2.prompt_token_ids) and "add" not in tok.decode(r2.prompt_token_ids)


async def test_lru_bound_keeps_memory_flat(make_client, tok):
    client, _ = make_client(["ok"], ledger_capacity=3)
    firsts = []
    for i in range(6):
        messages = [{"role": "user", "content": f"question {i}"}]
        r = await client.chat.completions.create(model="m", messages=messages)
        firsts.append((messages, r))
    assert len(client.ledger) == 3
    for i, (messages, r) in enumerate(firsts):
        known = client.measure_drift([*messages, r.choices[0].message])
        assert (known is None) == (i < 3)


async def test_records_store_only_their_own_ids(make_client, tok):
    client, _ = make_client(["one", "two", "three"])
    messages: list[Any] = [USER]
    for turn in range(3):
        r = await client.chat.completions.create(model="m", messages=messages)
        messages = [*messages, r.choices[0].message, {"role": "user", "content": f"next {turn}"}]
    record = client.ledger.get(prefix_hashes(messages[:-1])[-1])
    assert isinstance(record, LedgerRecord)
    assert list(record.added) == ids_of(tok, "<|im_start|>user\nnext 1<|im_end|>\n<|im_start|>assistant\n")
    assert list(record.sampled) == ids_of(tok, "three") + [tok.eos_token_id]
    assert (
        record.parent is not None and record.parent.parent is not None and record.parent.parent.parent is None
    )
    assert record.prompt_ids() == full_render(tok, messages[:-2])


async def test_template_that_rewrites_history_falls_back_and_counts_drift(make_client, tok):
    template = (
        "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + m.content }}"
        "{%- if m.role == 'assistant' and not loop.last %}{{- ' (earlier)' }}{%- endif %}"
        "{{- '<|im_end|>\\n' }}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )
    client, _ = make_client(["Five.", "ok"])
    from bridges.client.rendering import ChatRenderer

    client.renderer = ChatRenderer(tok, chat_template=template)
    r1 = await client.chat.completions.create(model="m", messages=[USER])
    follow = [USER, r1.choices[0].message, {"role": "user", "content": "sure?"}]
    r2 = await client.chat.completions.create(model="m", messages=follow, extra_body={"return_drift": True})
    # no clean bridge: the prompt is a full render, and the turn is counted as drifted
    assert tok.decode(r2.prompt_token_ids).count(" (earlier)") == 1
    assert r2.drifted_turns == 1 and r2.drift_tokens > 0
    assert client.measure_drift([*follow, r2.choices[0].message]) == (r2.drift_tokens, r2.drifted_turns)


async def test_concurrent_conversations_keep_separate_ledgers(make_client, tok):
    client, _ = make_client(
        lambda prompt, i: f"reply to {prompt.split('user')[-1].strip()[:12]}", engine_kwargs={"delay": 0.001}
    )

    async def conversation(i: int) -> bool:
        messages: list[Any] = [{"role": "user", "content": f"conv {i}"}]
        previous = None
        for turn in range(3):
            r = await client.chat.completions.create(model="m", messages=messages)
            if previous is not None:
                history = previous.prompt_token_ids + previous.choices[0].token_ids
                if r.prompt_token_ids[: len(history)] != history:
                    return False
            previous = r
            messages = [*messages, r.choices[0].message, {"role": "user", "content": f"turn {turn} of {i}"}]
        return True

    assert all(await asyncio.gather(*(conversation(i) for i in range(20))))


def test_message_key_normalises_objects_dicts_and_argument_formatting():
    from openai.types.chat import ChatCompletionMessage

    obj = ChatCompletionMessage.model_validate(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "x", "type": "function", "function": {"name": "f", "arguments": '{"a": 1, "b": 2}'}}
            ],
        }
    )
    as_dict = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "other", "type": "function", "function": {"name": "f", "arguments": '{"b":2,"a":1}'}}
        ],
    }
    assert message_key(obj) == message_key(as_dict)
    assert message_key({"role": "user", "content": "a"}) != message_key({"role": "user", "content": "b"})
    assert message_key({"role": "tool", "content": "5", "tool_call_id": "1"}) != message_key(
        {"role": "tool", "content": "5", "tool_call_id": "2"}
    )


def test_ledger_lru_evicts_least_recently_used():
    ledger = TokenLedger(capacity=2)
    records = [LedgerRecord(None, [i], [i], (), 1, None, None, True, False) for i in range(3)]
    ledger.put(1, records[0])
    ledger.put(2, records[1])
    assert ledger.get(1) is records[0]  # 1 is now the most recent
    ledger.put(3, records[2])
    assert ledger.get(2) is None and ledger.get(1) is records[0] and ledger.get(3) is records[2]


async def test_content_parts_render_like_text_and_extend(make_client, tok):
    client, _ = make_client(["Five.", "ok"])
    parts = [
        {"role": "user", "content": [{"type": "text", "text": "What is "}, {"type": "text", "text": "2+3?"}]}
    ]
    r1 = await client.chat.completions.create(model="m", messages=parts)
    assert r1.prompt_token_ids == full_render(tok, [USER])
    follow = [*parts, r1.choices[0].message, {"role": "user", "content": [{"type": "text", "text": "Sure?"}]}]
    r2 = await client.chat.completions.create(model="m", messages=follow)
    history = r1.prompt_token_ids + r1.choices[0].token_ids
    assert r2.prompt_token_ids[: len(history)] == history
    assert r2.prompt_token_ids == full_render(
        tok, [USER, {"role": "assistant", "content": "Five."}, {"role": "user", "content": "Sure?"}]
    )
