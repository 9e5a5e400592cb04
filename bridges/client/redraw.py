"""``tool_choice="required"`` among several tools: a reply that calls no declared tool is drawn again.

With one declared tool (or a named one) the client prefills the name, so the call is to a declared
tool by construction. With several, the model writes the name after the opener and may write one
that was never declared; an agent framework then fails the rollout ("Tool not found"). Rather than
mask the decoder (which samples from a renormalised distribution, so the engine's logprobs would no
longer be the policy's and the trainer's importance ratio would be off on those tokens), the reply
is drawn again, up to ``REDRAWS`` times, and the first that names only declared tools is kept. Every
kept token is the policy's own, with its own logprob; the only bias is the choice among whole
replies, the same as filtering replies that call no tool. When every draw named an undeclared tool,
a one-reply request names one of the declared tools itself (``fallback_name``: seeded by the
request's seed) and is drawn as a named ``tool_choice`` is: the name is then prefilled prompt, never
trained on, and the model writes the arguments. A request for several replies keeps the last draw.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from bridges.envs.types import Sample, SamplingParams

REDRAWS = 3
SEED_STRIDE = 7_919  # a seeded request draws again with seed + attempt * stride (+ the choice index)


def called_names(choice: dict[str, Any]) -> list[str]:
    """The function names a built ``choices[i]`` calls (empty when it calls none)."""
    return [call["function"]["name"] for call in choice["message"].get("tool_calls") or []]


async def redraw_undeclared(
    samples: list[Sample],
    params: SamplingParams,
    declared: Collection[str],
    read: Callable[[Sample], list[str]],
    draw: Callable[[SamplingParams], Awaitable[list[Sample]]],
) -> list[Sample]:
    """``samples`` with each one whose call names an undeclared tool drawn again (``draw``: one sample)."""
    kept = list(samples)
    for i, sample in enumerate(kept):
        for attempt in range(1, REDRAWS + 1):
            if declared_only(read(sample), declared):
                break
            seed = None if params.seed is None else params.seed + attempt * SEED_STRIDE + i
            (sample,) = await draw(dataclasses.replace(params, seed=seed))
        kept[i] = sample
    return kept


def declared_only(names: list[str], declared: Collection[str]) -> bool:
    return bool(names) and all(name in declared for name in names)


def fallback_name(declared: Collection[str], seed: int | None) -> str:
    """The declared tool a request names itself after ``REDRAWS`` undeclared draws (seeded: reproducible)."""
    return random.Random(seed).choice(sorted(declared))
