"""Segment-cached tokenization is exactly the backend's tokenization."""

from __future__ import annotations

import random
from typing import Any

from tokenizers import AddedToken

from bridges.client.segments import MIN_SEGMENTED_TEXT, SegmentEncoder, split_tokens


def test_split_tokens_exclude_tokens_that_do_not_split_unconditionally():
    tokens = [
        AddedToken("<|im_start|>", special=True, normalized=False),
        AddedToken("<|im_end|>", special=True, normalized=False),
        AddedToken("<lstrip>", lstrip=True, normalized=False),
        AddedToken("<rstrip>", rstrip=True, normalized=False),
        AddedToken("<word>", single_word=True, normalized=False),
        AddedToken("<norm>", normalized=True),
        AddedToken("<a>", normalized=False),
        AddedToken("<a>b", normalized=False),  # overlaps <a>: neither may be a boundary
    ]
    assert split_tokens(tokens) == ("<|im_start|>", "<|im_end|>")
    assert split_tokens(tokens, encode_special_tokens=True) == ()


def test_segmented_encode_equals_backend_encode(tok: Any):
    encoder = SegmentEncoder(tok)
    assert "<|im_start|>" in encoder.split_tokens and "<tool_call>" in encoder.split_tokens
    backend = tok.backend_tokenizer
    rng = random.Random(0)
    pieces = ["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<think>", "\n", " "]
    header = "system\nYou may call functions. " + "x" * 300 + " <tools>{}</tools>"
    for trial in range(40):
        parts = [header] if trial % 2 == 0 else []
        for _ in range(rng.randint(5, 30)):
            if rng.random() < 0.4:
                parts.append(rng.choice(pieces))
            else:
                parts.append("".join(rng.choice("abc <>|_/\n\t{}\"'") for _ in range(rng.randint(0, 200))))
        text = "".join(parts)
        expected = backend.encode(text, add_special_tokens=False).ids
        assert encoder.encode(text) == expected
        assert encoder.encode(text) == expected  # again, from the cache
    assert len(encoder._cache) > 0


def test_long_prompt_with_repeated_header_hits_the_cache(tok: Any):
    encoder = SegmentEncoder(tok)
    header = "<|im_start|>system\n" + "You are helpful. " * 40 + "<|im_end|>\n"
    for question in ("a", "b", "c"):
        text = header + f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
        assert len(text) >= MIN_SEGMENTED_TEXT
        assert encoder.encode(text) == tok.backend_tokenizer.encode(text, add_special_tokens=False).ids
    assert len(encoder._cache) == 1  # the system piece, encoded once
