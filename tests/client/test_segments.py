"""Segment-cached tokenization is exactly the backend's tokenization."""

from __future__ import annotations

import random
from typing import Any

from tokenizers import AddedToken

from bridges.client.segments import MIN_SEGMENTED_TEXT, SegmentEncoder, overlapping, split_tokens


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


def _overlaps_pairwise(a: str, b: str) -> bool:
    """The definition, pair by pair: one contains the other, or a proper suffix is a proper prefix."""
    if a in b or b in a:
        return True
    return any(a.endswith(b[:k]) or b.endswith(a[:k]) for k in range(1, min(len(a), len(b))))


def test_overlapping_equals_the_pairwise_definition_on_random_token_sets():
    rng = random.Random(3)
    for _ in range(300):
        contents = {
            "".join(rng.choice("<|>ab") for _ in range(rng.randint(1, 6))) for _ in range(rng.randint(1, 12))
        }
        expected = {a for a in contents if any(b != a and _overlaps_pairwise(a, b) for b in contents)}
        assert overlapping(contents) == expected, contents


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


def test_shared_encoding_of_nested_prefixes_equals_backend_encode(tok: Any):
    """The drift measurement encodes every prefix of a conversation with one memo: each prefix must
    still tokenize exactly as the backend would, pieces repeated across prefixes and turns included."""
    encoder = SegmentEncoder(tok)
    backend = tok.backend_tokenizer
    rng = random.Random(1)
    words = ["hello", "world", "12", "?", "assistant\n", "user\n", "\n", " ", "guess", "x" * 140]
    for trial in range(30):
        turns = []
        for _ in range(rng.randint(2, 8)):
            role = rng.choice(["user", "assistant", "tool"])
            body = "".join(rng.choice(words) for _ in range(rng.randint(0, 12)))
            if rng.random() < 0.2:
                body += "<tool_call>" + body[:20] + "</tool_call>"
            turns.append(f"<|im_start|>{role}\n{body}<|im_end|>\n")
        memo: dict[str, list[int]] = {}
        for k in range(1, len(turns) + 1):  # every prefix, longest last, as the drift walk reuses them
            text = "".join(turns[:k]) + "<|im_start|>assistant\n"
            expected = backend.encode(text, add_special_tokens=False).ids
            assert encoder.encode_shared(text, memo) == expected, (trial, k)
            assert encoder.encode(text) == expected


def test_shared_encoding_reuses_long_pieces_across_conversations(tok: Any):
    """A piece another conversation's measurement already encoded (a system prompt, an environment's
    fixed reply) is looked up, not sent to the backend again; the ids stay the backend's."""
    encoder = SegmentEncoder(tok)
    calls: list[str] = []
    encode_one = encoder.encode_one

    def counted(text: str) -> list[int]:
        calls.append(text)
        return encode_one(text)

    encoder.encode_one = counted  # type: ignore[method-assign]
    system = "<|im_start|>system\nGuess the secret number between 1 and 100. Answer with a number.<|im_end|>\n"
    for question in ("Guess the number, please.", "Guess it again, please now."):
        text = system + f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
        assert encoder.encode_shared(text, {}) == tok.backend_tokenizer.encode(text, add_special_tokens=False).ids
    long_pieces = [c for c in calls if len(c) > 24]
    assert long_pieces.count("system\nGuess the secret number between 1 and 100. Answer with a number.") == 1
    assert len(long_pieces) == 3  # the system piece once, each question once


def test_the_shared_cache_holds_a_bounded_number_of_ids(tok: Any):
    """Long pieces (a tool result, a long reply) are cached too; the LRU drops its oldest pieces once
    the ids it holds pass its budget, and what it returns stays the backend's ids."""
    encoder = SegmentEncoder(tok, cache_tokens=300)
    backend = tok.backend_tokenizer
    for k in range(12):
        body = f"result {k} " * 20
        text = f"<|im_start|>tool\n{body}<|im_end|>\n<|im_start|>assistant\n"
        assert encoder.encode_shared(text, {}) == backend.encode(text, add_special_tokens=False).ids
        held = sum(len(ids) for ids in encoder._cache.values())
        assert held == encoder._held_tokens <= 300
    assert 0 < len(encoder._cache) < 12  # the oldest pieces went
