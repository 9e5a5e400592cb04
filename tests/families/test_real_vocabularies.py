"""The family fixtures are the real vocabularies: published ids, special tokens where they belong."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    ("name", "text", "ids"),
    [
        ("tiny-qwen2.5", "Hello world!", [9707, 1879, 0]),  # Qwen2.5's published ids
        ("tiny-qwen3", "Hello world!", [9707, 1879, 0]),
        ("tiny-llama3", "Hello world!", [9906, 1917, 0]),  # Llama 3's
        (
            "tiny-mistral",
            "Hello world!",
            [9906, 1917, 0],
        ),  # cl100k's (Mistral's own vocabulary is not offline)
        ("tiny-deepseek-v3", "Hello world!", [19923, 2058, 3]),
    ],
)
def test_text_encodes_to_the_published_ids(family_tokenizers, name, text, ids):
    assert family_tokenizers[name].encode(text, add_special_tokens=False) == ids


@pytest.mark.parametrize(
    ("name", "token", "token_id"),
    [
        ("tiny-qwen2.5", "<|im_end|>", 151645),
        ("tiny-qwen2.5", "<tool_call>", 151657),
        ("tiny-qwen3", "<think>", 151667),
        ("tiny-qwen3", "</think>", 151668),
        ("tiny-llama3", "<|eot_id|>", 128009),
        ("tiny-llama3", "<|python_tag|>", 128010),
        ("tiny-deepseek-v3", "<｜end▁of▁sentence｜>", 1),
        ("tiny-deepseek-v3", "<｜tool▁calls▁begin｜>", 128806),
    ],
)
def test_special_tokens_have_their_published_ids(family_tokenizers, name, token, token_id):
    tokenizer = family_tokenizers[name]
    assert tokenizer.convert_tokens_to_ids(token) == token_id
    assert tokenizer.encode(f"a{token}b", add_special_tokens=False)[1] == token_id  # split out of text


def test_bpe_merges_across_what_a_message_boundary_would_split(family_tokenizers):
    """Why these fixtures exist: decoding sampled ids and encoding the text again is not the identity."""
    tokenizer = family_tokenizers["tiny-qwen2.5"]
    pieces = tokenizer.encode("Hel", add_special_tokens=False) + tokenizer.encode(
        "lo", add_special_tokens=False
    )
    assert tokenizer.decode(pieces) == "Hello"
    assert tokenizer.encode("Hello", add_special_tokens=False) != pieces
