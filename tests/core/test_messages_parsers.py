"""Message normalisation, parsers and tool schemas."""

from __future__ import annotations

import enum
from types import SimpleNamespace
from typing import Literal

import pytest
from openai.types.chat import ChatCompletion

from bridges.envs.messages import to_message_dict, to_message_dicts
from bridges.envs.parsers import Parser, ThinkParser, XMLParser
from bridges.envs.tool_schema import tool_schema
from bridges.runtime.errors import ConfigError


def test_plain_dict_is_copied_with_its_keys():
    m = {"role": "user", "content": "hi"}
    out = to_message_dict(m)
    assert out == m and out is not m


def test_sdk_message_with_tool_calls_keeps_none_content_and_reasoning():
    resp = ChatCompletion.model_validate(
        {
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "tool_calls",
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "reasoning_content": "think",
                        "tool_calls": [
                            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                        ],
                    },
                }
            ],
        }
    )
    out = to_message_dict(resp.choices[0].message)
    assert out == {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        "reasoning_content": "think",
    }


def test_verifiers_style_object_and_content_parts_and_arrow_nulls():
    obj = SimpleNamespace(
        role="assistant", content=None, tool_calls=[SimpleNamespace(id="a", name="g", arguments={"x": 1})]
    )
    assert to_message_dict(obj)["tool_calls"] == [
        {"id": "a", "type": "function", "function": {"name": "g", "arguments": '{"x": 1}'}}
    ]
    parts = {
        "role": "user",
        "content": [{"type": "text", "text": "a"}, {"type": "image_url"}, {"type": "text", "text": "b"}],
    }
    assert to_message_dict(parts) == {"role": "user", "content": "ab"}
    # a row that went through Arrow gets every key, absent ones as None; they are dropped again
    arrow = {"role": "user", "content": "q", "tool_calls": None, "tool_call_id": None, "name": None}
    assert to_message_dict(arrow) == {"role": "user", "content": "q"}
    assert to_message_dicts("hello") == [{"role": "user", "content": "hello"}]
    with pytest.raises(ValueError, match="needs a 'role'"):
        to_message_dict({"content": "x"})


def test_parser_parse_answer_uses_last_assistant_message():
    p = Parser(lambda s: s.upper())
    conv = [
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "b"},
    ]
    assert p.parse_answer(conv) == "B"
    assert p.parse_answer("x") == "X"
    assert p.parse_answer([{"role": "user", "content": "u"}]) is None
    assert p.get_format_reward_func()(completion=conv) == 1.0


def test_xml_parser_fields_alternatives_and_format_reward():
    p = XMLParser(["think", ("answer", "code")])
    parsed = p.parse("<think>\nhm\n</think>\n<code>\n42\n</code>")
    assert parsed.think == "hm" and parsed.code == "42" and parsed.answer is None
    conv = [
        {"role": "assistant", "content": "<answer>1</answer>"},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": "no tags here"},
    ]
    assert p.parse_answer(conv) == "1"  # newest assistant message that has the field
    assert p.get_fields() == ["think", "answer"]
    assert p.format(think="t", answer="a") == "<think>\nt\n</think>\n<answer>\na\n</answer>"
    fmt = p.get_format_reward_func()
    assert fmt([{"role": "assistant", "content": p.format(think="t", answer="a")}]) == pytest.approx(1.0)
    # one of two fields, not newline-separated, starts wrong, ends with the last field
    assert fmt([{"role": "assistant", "content": "x <answer>1</answer>"}]) == pytest.approx(0.2 + 0.2)
    assert fmt([{"role": "assistant", "content": "plain"}]) == 0.0


def test_think_parser_plain_text_and_split_reasoning():
    p = ThinkParser()
    assert p.parse("<think>a</think> 7") == "7"
    assert p.parse("<think>unfinished") == ""
    split = [{"role": "assistant", "content": "7", "reasoning_content": "because"}]
    assert p.parse_answer(split) == "7"
    fmt = p.get_format_reward_func()
    assert fmt(split) == 1.0
    assert (
        fmt([{"role": "assistant", "content": "<think>a</think>7"}, {"role": "assistant", "content": "7"}])
        == 0.5
    )


class Unit(enum.Enum):
    C = "celsius"
    F = "fahrenheit"


def get_weather(city: str, days: int = 1, unit: Unit = Unit.C, hourly: bool | None = None) -> str:
    """Get the weather forecast for a city.

    Args:
        city: The city name,
            for example Paris.
        days: How many days to forecast.
        unit: Temperature unit.
    """
    return city


def search(
    query: str, tags: list[str], mode: Literal["fast", "exact"], limits: dict[str, float], k: float = 1.0
):
    """Search the index.

    :param query: what to look for
    :param tags: tags to filter on
    :returns: hits
    """


def test_tool_schema_google_docstring_enum_optional_required():
    schema = tool_schema(get_weather)
    fn = schema["function"]
    assert schema["type"] == "function" and fn["name"] == "get_weather"
    assert fn["description"] == "Get the weather forecast for a city."
    params = fn["parameters"]
    assert params["required"] == ["city"] and params["additionalProperties"] is False
    assert params["properties"]["city"] == {
        "type": "string",
        "description": "The city name, for example Paris.",
    }
    assert params["properties"]["days"] == {"type": "integer", "description": "How many days to forecast."}
    assert params["properties"]["unit"] == {
        "type": "string",
        "enum": ["celsius", "fahrenheit"],
        "description": "Temperature unit.",
    }
    assert params["properties"]["hourly"] == {"type": ["boolean", "null"]}


def test_tool_schema_rest_docstring_containers_literal():
    params = tool_schema(search)["function"]["parameters"]
    assert params["required"] == ["query", "tags", "mode", "limits"]
    assert params["properties"]["query"] == {"type": "string", "description": "what to look for"}
    assert params["properties"]["tags"] == {
        "type": "array",
        "items": {"type": "string"},
        "description": "tags to filter on",
    }
    assert params["properties"]["mode"] == {"type": "string", "enum": ["fast", "exact"]}
    assert params["properties"]["limits"] == {"type": "object", "additionalProperties": {"type": "number"}}
    assert params["properties"]["k"] == {"type": "number"}
    with pytest.raises(ConfigError, match="named function"):
        tool_schema(lambda x: x)


def test_read_field_reads_dicts_fields_extras_properties_and_plain_objects_alike():
    from openai.types.chat import ChatCompletionMessage
    from pydantic import BaseModel, ConfigDict

    from bridges.envs.messages import read_field

    message = ChatCompletionMessage.model_validate(
        {"role": "assistant", "content": "hi", "reasoning_content": "because"}
    )
    assert read_field(message, "content") == "hi"
    assert read_field(message, "reasoning_content") == "because"  # an extra the SDK keeps
    assert read_field(message, "tool_call_id") is None  # neither a field nor an extra
    assert read_field(ChatCompletionMessage(role="assistant", content="x"), "reasoning_content") is None

    class WithProperty(BaseModel):
        model_config = ConfigDict(extra="allow")
        value: int = 1

        @property
        def doubled(self) -> int:
            return self.value * 2

    assert read_field(WithProperty(value=3), "doubled") == 6
    assert read_field(WithProperty(value=3, note="n"), "note") == "n"
    assert read_field({"a": 1}, "a") == 1 and read_field({"a": 1}, "b") is None

    class Plain:
        role = "user"

    assert read_field(Plain(), "role") == "user" and read_field(Plain(), "content") is None
