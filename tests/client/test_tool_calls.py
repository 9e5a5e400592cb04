"""Tool-call parsing: both families, deterministic ids, malformed markup kept as a call."""

from __future__ import annotations

import json
import re

import pytest

from bridges.client.tool_calls import get_tool_parser, parse_hermes, parse_llama3_json, tool_call_id

IDS = [5, 6, 7]


def test_hermes_single_call_has_name_arguments_and_no_content():
    text = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    reply = parse_hermes(text, IDS)
    assert reply.content is None
    [call] = reply.tool_calls
    assert call.name == "add"
    assert json.loads(call.arguments) == {"a": 2, "b": 3}
    assert call.arguments == '{"a": 2, "b": 3}'  # re-rendered by the template exactly as sampled
    assert call.valid
    assert re.fullmatch(r"call_[0-9a-f]{24}", call.id)
    assert call.to_openai() == {
        "id": call.id,
        "type": "function",
        "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'},
    }


def test_hermes_several_calls_after_text():
    text = (
        "Let me look both up.\n"
        '<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "weather", "parameters": {"city": "Oslo"}}\n</tool_call>'
    )
    reply = parse_hermes(text, IDS)
    assert reply.content == "Let me look both up."  # exactly one template newline removed
    assert [c.name for c in reply.tool_calls] == ["weather", "weather"]
    assert [json.loads(c.arguments)["city"] for c in reply.tool_calls] == ["Paris", "Oslo"]
    assert reply.tool_calls[0].id != reply.tool_calls[1].id


def test_ids_are_deterministic_per_sample_and_index():
    text = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    first = parse_hermes(text, [1, 2, 3]).tool_calls[0].id
    assert parse_hermes(text, [1, 2, 3]).tool_calls[0].id == first
    assert parse_hermes(text, [1, 2, 4]).tool_calls[0].id != first
    assert tool_call_id([1, 2, 3], 0) == first
    assert tool_call_id([1, 2, 3], 1) != first


def test_hermes_malformed_json_is_kept_with_recovered_name():
    text = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": }\n</tool_call>'
    [call] = parse_hermes(text, IDS).tool_calls
    assert call.name == "add"
    assert call.arguments == '{"name": "add", "arguments": {"a": 2, "b": }'
    assert not call.valid


def test_hermes_garbage_without_name_still_yields_a_call():
    [call] = parse_hermes("<tool_call>not json at all</tool_call>", IDS).tool_calls
    assert (call.name, call.arguments, call.valid) == ("", "not json at all", False)


def test_hermes_unclosed_call_from_a_truncated_sample_counts():
    reply = parse_hermes('<tool_call>\n{"name": "add", "arguments": {"a": 2', IDS)
    [call] = reply.tool_calls
    assert call.name == "add" and not call.valid


def test_hermes_plain_text_is_untouched():
    reply = parse_hermes("The answer is 5.", IDS)
    assert reply.content == "The answer is 5." and reply.tool_calls == []


def test_llama3_json_call_with_and_without_python_tag():
    for prefix in ("", "<|python_tag|>"):
        reply = parse_llama3_json(prefix + '{"name": "add", "parameters": {"a": 1}}', IDS)
        assert reply.content is None
        [call] = reply.tool_calls
        assert call.name == "add" and json.loads(call.arguments) == {"a": 1} and call.valid


def test_llama3_json_several_calls_separated_by_semicolons():
    reply = parse_llama3_json('{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"x": 1}}', IDS)
    assert [c.name for c in reply.tool_calls] == ["a", "b"]
    assert json.loads(reply.tool_calls[1].arguments) == {"x": 1}


def test_llama3_json_malformed_after_python_tag_is_kept():
    [call] = parse_llama3_json('<|python_tag|>{"name": "add", "parameters": {"a": 1', IDS).tool_calls
    assert call.name == "add" and not call.valid and call.arguments.startswith('{"name": "add"')


def test_llama3_json_plain_text_and_non_call_json_are_not_calls():
    assert parse_llama3_json("The answer is 5.", IDS).tool_calls == []
    reply = parse_llama3_json('{"answer": 5}', IDS)
    assert reply.tool_calls == [] and reply.content == '{"answer": 5}'


def test_unknown_parser_is_one_sentence():
    with pytest.raises(
        ValueError,
        match="unknown tool_parser 'xml'; choose one of: hermes, llama3_json, mistral, deepseek_v3",
    ):
        get_tool_parser("xml")
