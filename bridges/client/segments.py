"""Exact tokenization that never re-tokenizes the fixed pieces of a prompt.

Every first turn of a rollout renders the same system prompt, tool header and few-shot examples,
and the tokenizer's cost grows with every character (~0.1 us per character for the tiny
tokenizer: ~80 us for a two-tool header). Those pieces sit between added tokens (``<|im_start|>``,
``<|im_end|>``, ``<tool_call>``...), and a Hugging Face tokenizer splits added tokens out of the
text before anything else runs, so the ids of a text are the concatenation of the ids of its pieces.
This module caches the ids of long pieces (LRU) and encodes the rest in one call; the result is
identical to ``backend.encode(text, add_special_tokens=False).ids`` (a test pins it).

Only tokens that split the text unconditionally are used as boundaries: not ``lstrip``/``rstrip``
(they would eat a neighbour's whitespace), not ``single_word`` (matching depends on neighbours),
not ``normalized`` (matched after normalisation), not special when the backend is told to encode
special tokens as text, and not overlapping any other added token (leftmost-longest matching
could then pick the other one).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

MIN_CACHED_SEGMENT = 128  # characters: shorter pieces cost less to encode than to look up
MIN_SEGMENTED_TEXT = 512  # characters: below this one encode call is cheaper than splitting
CACHE_SIZE = 2048
CACHE_TOKENS = 2_000_000  # ids the LRU holds at most (~70 MB as Python ints), however long the pieces
MAX_SHORT_PIECE = 24  # characters: pieces kept for good by ``encode_shared`` (role headers, newlines)
SHORT_PIECES = 4096


def overlapping(contents: Iterable[str]) -> set[str]:
    """The contents that could match a span overlapping another content's match: one contains the other,
    or a proper suffix of one is a proper prefix of the other.

    Linear in the total of squared token lengths, not quadratic in the number of tokens: DeepSeek-V3's
    tokenizer has ~800 added tokens, and comparing every pair took ~50 s per tokenizer load.
    """
    unique = set(contents)
    bad: set[str] = set()
    prefix_owners: dict[str, set[str]] = {}
    for text in unique:
        for k in range(1, len(text)):
            prefix_owners.setdefault(text[:k], set()).add(text)
        for i in range(len(text)):  # a shorter content inside this one: both are ambiguous
            for j in range(i + 1, len(text) + 1 - (i == 0)):
                if text[i:j] in unique:
                    bad.update((text, text[i:j]))
    for text in unique:
        for k in range(1, len(text)):
            owners = prefix_owners.get(text[-k:], set()) - {text}
            if owners:
                bad.add(text)
                bad.update(owners)
    return bad


def split_tokens(added: Iterable[Any], encode_special_tokens: bool = False) -> tuple[str, ...]:
    """The added tokens that split any text unconditionally, longest first."""
    tokens = list(added)
    ambiguous = overlapping(t.content for t in tokens)
    safe = []
    for token in tokens:
        if token.lstrip or token.rstrip or token.single_word or token.normalized:
            continue
        if encode_special_tokens and token.special:
            continue
        if token.content in ambiguous:
            continue
        safe.append(token.content)
    return tuple(sorted(safe, key=len, reverse=True))


class SegmentEncoder:
    """``encode(text)`` == the backend's ids, with long pieces between split tokens cached."""

    def __init__(self, tokenizer: Any, cache_size: int = CACHE_SIZE, cache_tokens: int = CACHE_TOKENS) -> None:
        backend = tokenizer.backend_tokenizer
        self._backend = backend
        self._encode_batch = getattr(backend, "encode_batch_fast", None)
        added = getattr(tokenizer, "added_tokens_decoder", {}).values()
        self.split_tokens = split_tokens(added, bool(getattr(backend, "encode_special_tokens", False)))
        self._split = (
            re.compile("(" + "|".join(map(re.escape, self.split_tokens)) + ")") if self.split_tokens else None
        )
        self._cache: OrderedDict[str, list[int]] = OrderedDict()
        self._cache_size = cache_size
        self._cache_tokens, self._held_tokens = cache_tokens, 0
        # short pieces every conversation repeats ("\n", "assistant\n"), and the split tokens
        self._short: dict[str, list[int]] = {token: self.encode_one(token) for token in self.split_tokens}

    def encode_one(self, text: str) -> list[int]:
        """One backend call (``encode_batch_fast`` skips offsets: ~2x faster than ``encode``)."""
        if self._encode_batch is not None:
            return self._encode_batch([text], add_special_tokens=False)[0].ids
        return self._backend.encode(text, add_special_tokens=False).ids

    def starts_with_split_token(self, text: str) -> bool:
        """Text that starts with a split token tokenizes the same whatever precedes it."""
        return bool(self.split_tokens) and text.startswith(self.split_tokens)

    def encode_shared(self, text: str, memo: dict[str, list[int]]) -> list[int]:
        """``encode(text)`` for one of several texts that share most of their pieces (the prefixes of
        one conversation, as the drift measurement renders them): each piece between split tokens is
        encoded once per ``memo``, so n nested prefixes cost about one encode of the longest, not n.

        Longer pieces also go through the shared LRU: pieces recur across conversations too (a system
        prompt, few-shot turns, an environment's fixed replies), and here each piece would be one
        backend call of its own (~4 us however short), where a lookup costs a hash of the piece."""
        if self._split is None:
            return self.encode(text)
        out: list[int] = []
        short = self._short
        for part in self._split.split(text):
            if not part:
                continue
            if len(part) <= MAX_SHORT_PIECE:
                ids = short.get(part)
                if ids is None:
                    ids = self.encode_one(part)
                    if len(short) < SHORT_PIECES:
                        short[part] = ids
            else:
                ids = memo.get(part)
                if ids is None:
                    ids = memo[part] = self._cached(part)
            out += ids
        return out

    def _cached(self, part: str) -> list[int]:
        """``part``'s ids from the shared LRU, encoded and remembered there when missing.

        Bounded in pieces and in the ids they hold: a long tool result or reply is a piece too, and
        2,048 of them could otherwise hold gigabytes of ids."""
        cache = self._cache
        ids = cache.get(part)
        if ids is not None:
            cache.move_to_end(part)
            return ids
        ids = cache[part] = self.encode_one(part)
        self._held_tokens += len(ids)
        while cache and (len(cache) > self._cache_size or self._held_tokens > self._cache_tokens):
            self._held_tokens -= len(cache.popitem(last=False)[1])
        return ids

    def encode(self, text: str) -> list[int]:
        if self._split is None or len(text) < MIN_SEGMENTED_TEXT:
            return self.encode_one(text)
        out: list[int] = []
        pending: list[str] = []  # short pieces and split tokens, encoded together in one call
        for index, part in enumerate(self._split.split(text)):
            if index % 2 == 1 or len(part) < MIN_CACHED_SEGMENT:
                pending.append(part)
                continue
            ids = self._cached(part)
            if pending:
                out += self.encode_one("".join(pending))
                pending.clear()
            out += ids
        if pending:
            out += self.encode_one("".join(pending))
        return out
