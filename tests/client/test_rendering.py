"""Rendering parity with transformers, and the template facts the ledger relies on."""

from __future__ import annotations

from typing import Any

import pytest

from bridges.client.rendering import ChatRenderer, ChatTemplateError

ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
NOTE_TOOL = {
    "type": "function",
    "function": {"name": "note", "description": "Keep a note «as is» <b>", "parameters": {"type": "object"}},
}

CONVERSATIONS: list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]] = [
    ([{"role": "user", "content": "hi"}], None),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+3?"}], None),
    (
        [
            {"role": "user", "content": "q1"},
            {"role": "assistant", "content": "a1", "reasoning_content": "let me think"},
            {"role": "user", "content": "q2\twith\ttabs\nand lines"},
        ],
        None,
    ),
    (
        [
            {"role": "system", "content": "You can add."},
            {"role": "user", "content": "2+3 and 4+5?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'},
                    },
                    {
                        "id": "c2",
                        "type": "function",
                        "function": {"name": "add", "arguments": {"a": 4, "b": 5}},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "5"},
            {"role": "tool", "tool_call_id": "c2", "content": "9"},
            {"role": "assistant", "content": "5 and 9."},
            {"role": "user", "content": "thanks"},
        ],
        [ADD_TOOL, NOTE_TOOL],
    ),
    ([{"role": "user", "content": "note «this»"}], [NOTE_TOOL]),
]

LLAMA_LIKE = (
    "{{- bos_token }}"
    "{%- if messages[0].role != 'user' and messages[0].role != 'system' %}"
    "{{- raise_exception('Conversations must start with a user or system message') }}{%- endif %}"
    "{{- '<|im_start|>system\\nToday: ' + strftime_now('%Y') + '<|im_end|>\\n' }}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] | trim + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@pytest.mark.parametrize("index", range(len(CONVERSATIONS)))
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_render_matches_apply_chat_template(tiny_tokenizer: Any, index: int, add_generation_prompt: bool):
    messages, tools = CONVERSATIONS[index]
    renderer = ChatRenderer(tiny_tokenizer)
    expected = tiny_tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    assert renderer.render_text(messages, tools, add_generation_prompt) == expected
    expected_ids = tiny_tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=True, add_generation_prompt=add_generation_prompt
    )["input_ids"]
    assert renderer.render_ids(messages, tools, add_generation_prompt) == expected_ids


def test_custom_template_with_bos_strftime_and_trim_matches(tiny_tokenizer: Any):
    renderer = ChatRenderer(tiny_tokenizer, chat_template=LLAMA_LIKE)
    messages = [{"role": "system", "content": "  padded  "}, {"role": "user", "content": "hi "}]
    expected = tiny_tokenizer.apply_chat_template(
        messages, chat_template=LLAMA_LIKE, tokenize=False, add_generation_prompt=True
    )
    assert renderer.render_text(messages, None, True) == expected


def test_raise_exception_becomes_a_template_error(tiny_tokenizer: Any):
    renderer = ChatRenderer(tiny_tokenizer, chat_template=LLAMA_LIKE)
    with pytest.raises(ChatTemplateError, match="must start with a user or system message"):
        renderer.render_text([{"role": "assistant", "content": "x"}], None, True)


def test_closing_ids_complete_what_the_engine_did_not_sample(tok: Any):
    renderer = ChatRenderer(tok)
    im_end, newline = tok.convert_tokens_to_ids(["<|im_end|>", "\n"])
    sampled = renderer.encode("hello") + [im_end]
    assert renderer.closing_ids(sampled, "stop", None, None) == (newline,)
    assert renderer.closing_ids(renderer.encode("hel"), "length", None, None) == (im_end, newline)
    # stopped on a stop string: the end-of-turn was never sampled, so the whole closing is added
    assert renderer.closing_ids(renderer.encode("hello STOP"), "stop", None, None) == (im_end, newline)


def test_bridge_is_the_rendered_new_messages_plus_generation_prompt(tok: Any):
    renderer = ChatRenderer(tok)
    new = [{"role": "user", "content": "next question"}]
    bridge = renderer.bridge_ids(new, None, None)
    assert bridge == renderer.encode("<|im_start|>user\nnext question<|im_end|>\n<|im_start|>assistant\n")
    tool_new = [{"role": "tool", "tool_call_id": "c1", "content": "5"}]
    tools = [ADD_TOOL]
    assert renderer.bridge_ids(tool_new, tools, "k") == renderer.encode(
        "<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    # the tool header is part of the dummy base, never of the bridge
    assert "# Tools" not in tok.decode(renderer.bridge_ids(tool_new, tools, "k"))


def test_bridge_refuses_a_template_that_rewrites_history(tok: Any):
    # renders an assistant message differently once something follows it (like templates that strip
    # reasoning from past turns): the diff is not a clean suffix, so no bridge
    template = (
        "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + m.content }}"
        "{%- if m.role == 'assistant' and not loop.last %}{{- ' (earlier)' }}{%- endif %}"
        "{{- '<|im_end|>\\n' }}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )
    renderer = ChatRenderer(tok, chat_template=template)
    assert renderer.bridge_ids([{"role": "user", "content": "more"}], None, None) is None


def test_shortest_equivalent_dummy_is_used(tok: Any):
    assert len(ChatRenderer(tok).dummy(None, None).messages) == 1  # [assistant] suffices for ChatML
    # a template that insists on a leading user/system message keeps the two-message dummy
    renderer = ChatRenderer(tok, chat_template=LLAMA_LIKE)
    assert len(renderer.dummy(None, None).messages) == 2
    assert renderer.bridge_ids([{"role": "user", "content": "x"}], None, None) == renderer.encode(
        "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"
    )


def test_a_tokenizer_without_template_is_one_sentence(tok: Any):
    clone = tok.__class__(tokenizer_object=tok.backend_tokenizer, eos_token="<|im_end|>")
    clone.chat_template = None
    with pytest.raises(ChatTemplateError, match="has no chat_template"):
        ChatRenderer(clone)
