"""Model families and their tool-call formats: detection, overrides, the two new parsers and openers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bridges.client.families import FAMILY_NAMES, detect_family, get_family, resolve_family
from bridges.client.tool_calls import (
    TOOL_FORMATS,
    get_tool_format,
    parse_deepseek_v3,
    parse_mistral,
    tool_call_id,
)
from bridges.models.tiny import TINY_CHAT_TEMPLATE

TEMPLATES = Path(__file__).resolve().parents[2] / "bridges" / "models" / "chat-templates"
IDS = [11, 12, 13]


@pytest.mark.parametrize(
    ("template", "family", "tool_format"),
    [
        ("qwen2.5", "hermes", "hermes"),
        ("qwen3", "qwen3", "hermes"),
        ("llama3", "llama3", "llama3_json"),
        ("mistral", "mistral", "mistral"),
        ("deepseek_v3", "deepseek_v3", "deepseek_v3"),
    ],
)
def test_each_family_template_is_detected(template, family, tool_format):
    found = detect_family((TEMPLATES / f"{template}.jinja").read_text())
    assert (found.name, found.tool_format) == (family, tool_format)


class _Tok:
    def __init__(self, template: str) -> None:
        self.chat_template = template


def test_reasoning_is_split_only_when_the_template_prints_it_back():
    assert resolve_family(_Tok(TINY_CHAT_TEMPLATE), None, None).reasoning == ("<think>", "</think>")
    assert resolve_family(_Tok((TEMPLATES / "qwen3.jinja").read_text()), None, None).reasoning is not None
    # Qwen2.5's template never prints reasoning_content: a <think> reply stays content, verbatim
    assert resolve_family(_Tok((TEMPLATES / "qwen2.5.jinja").read_text()), None, None).reasoning is None


def test_overrides_and_unknown_names():
    tok = _Tok(TINY_CHAT_TEMPLATE)
    assert resolve_family(tok, "llama3", None).tool_format == "llama3_json"
    assert resolve_family(tok, None, "mistral").tool_format == "mistral"
    assert resolve_family(tok, None, "auto").tool_format == "hermes"
    assert detect_family("{{ messages }}").name == "generic" and "generic" in FAMILY_NAMES
    with pytest.raises(ValueError, match="unknown model family 'gpt'; choose one of: deepseek_v3, mistral"):
        get_family("gpt")
    with pytest.raises(ValueError, match="unknown tool_parser 'xml'"):
        resolve_family(tok, None, "xml")


def test_mistral_calls_list_content_and_malformed():
    reply = parse_mistral(
        'Let me check.[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1}}, {"name": "f", "arguments": {}}]',
        IDS,
    )
    assert reply.content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in reply.tool_calls] == [("add", {"a": 1}), ("f", {})]
    assert reply.tool_calls[1].id == tool_call_id(IDS, 1)
    assert parse_mistral("no calls here", IDS).tool_calls == []
    broken = parse_mistral('[TOOL_CALLS] [{"name": "add", "arguments": {"a": ', IDS)
    [call] = broken.tool_calls
    assert (call.name, call.valid, call.arguments) == ("add", False, '[{"name": "add", "arguments": {"a":')


def test_deepseek_v3_calls_fenced_arguments_and_truncation():
    call = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{args}\n```<｜tool▁call▁end｜>"
    text = (
        "Sure.<｜tool▁calls▁begin｜>"
        + call.format(name="lookup", args='{"key": "a"}')
        + "\n"
        + call.format(name="add", args='{"a": 1, "b": 2}')
        + "<｜tool▁calls▁end｜>"
    )
    reply = parse_deepseek_v3(text, IDS)
    assert reply.content == "Sure."
    assert [(c.name, c.arguments, c.valid) for c in reply.tool_calls] == [
        ("lookup", '{"key": "a"}', True),
        ("add", '{"a": 1, "b": 2}', True),
    ]
    cut = parse_deepseek_v3(
        '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>lookup\n```json\n{"ke', IDS
    )
    [partial] = cut.tool_calls
    assert (partial.name, partial.valid, partial.arguments) == ("lookup", False, '{"ke')
    bare = parse_deepseek_v3("<｜tool▁calls▁begin｜>", IDS)
    assert [(c.name, c.valid) for c in bare.tool_calls] == [("", False)]


@pytest.mark.parametrize("name", sorted(TOOL_FORMATS))
def test_a_forced_call_parses_once_the_model_completes_the_opener(name):
    """What the prefill begins, the parser reads: opener + the rest of a well-formed call."""
    tail = {
        "hermes": '{"a": 1}}\n</tool_call>',
        "llama3_json": '{"a": 1}}',
        "mistral": '{"a": 1}}]',
        "deepseek_v3": '{"a": 1}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    }[name]
    fmt = get_tool_format(name)
    [call] = fmt.parse(fmt.opener("add") + tail, IDS).tool_calls
    assert (call.name, json.loads(call.arguments), call.valid) == ("add", {"a": 1}, True)
    assert fmt.opener(None) and fmt.opener("add").startswith(fmt.opener(None)[: len(fmt.opener(None)) - 1])
    assert '\\"' in fmt.opener('say "hi"') or name == "deepseek_v3"  # names are escaped where JSON holds them
