"""The fidelity run: many random multi-turn tool episodes through ``EngineClient``, checked token by token.

What it proves on a real vocabulary (``model=tiny-<family>``, bridges/models/family_models.py), where a
random model's samples are often tokenisations no tokenizer would produce: every turn's prompt
extends the previous turn's prompt + sampled ids exactly (a *ledger break* is a turn that does
not), so each episode becomes one training sample; and how far a re-render of the same
conversation from its messages would have drifted (what a client without a ledger trains on),
split by cause: turns whose re-rendered *text* differs from what the model saw (a template that
rewrites history, or a reply whose parse does not print back as sampled) and turns where only the
*ids* differ (the same text, tokenised canonically rather than as sampled).

Episodes look like agent traffic: a system prompt, two tools, ``tool_choice`` drawn per turn from
auto / none / required / a named function, tool results or a user nudge after each reply, and a
quarter of the episodes streamed and reassembled from chunks the way agent frameworks do.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import asdict, dataclass
from typing import Any

from bridges.envs.types import Turn
from bridges.workflows.samples import SampleStats, turns_to_samples

TOOLS = [
    {"type": "function", "function": {"name": "lookup", "description": "Look a key up.",
     "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}},
    {"type": "function", "function": {"name": "add", "description": "Add two integers.",
     "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}},
]
_CHOICES: list[Any] = [
    "auto",
    "auto",
    "none",
    "required",
    {"type": "function", "function": {"name": "lookup"}},
]


@dataclass
class FidelityReport:
    """Totals over a run; ``drift_tokens``: ids a re-render would have differed in, summed over turns."""

    family: str
    episodes: int = 0
    turns: int = 0
    ledger_breaks: int = 0
    drift_tokens: int = 0
    drifted_turns: int = 0
    rewritten_turns: int = 0  # the re-rendered prompt text differs from the text the model saw
    retokenized_turns: int = 0  # same text, other ids
    tool_call_turns: int = 0
    reasoning_turns: int = 0
    streamed_episodes: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


async def _assemble(stream: Any) -> tuple[dict[str, Any], list[int], list[int]]:
    """The message a streaming agent builds from the deltas, plus the prompt and sampled ids."""
    message: dict[str, Any] = {"role": "assistant", "content": ""}
    calls: dict[int, dict[str, Any]] = {}
    prompt_ids: list[int] = []
    sampled: list[int] = []
    async for chunk in stream:
        extra = chunk.model_extra or {}
        prompt_ids = extra.get("prompt_token_ids", prompt_ids)
        for choice in chunk.choices:
            sampled = (choice.model_extra or {}).get("token_ids", sampled)
            delta = choice.delta
            message["content"] += delta.content or ""
            if (delta.model_extra or {}).get("reasoning_content"):
                message["reasoning_content"] = delta.model_extra["reasoning_content"]
            for call in delta.tool_calls or []:
                slot = calls.setdefault(
                    call.index, {"id": call.id, "type": "function", "function": {"name": "", "arguments": ""}}
                )
                slot["function"]["name"] += call.function.name or ""
                slot["function"]["arguments"] += call.function.arguments or ""
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message, prompt_ids, sampled


async def _turn(
    client: Any, messages: list[Any], rng: random.Random, stream: bool
) -> tuple[dict[str, Any], Turn]:
    kwargs = {"model": client.model_name, "messages": messages, "tools": TOOLS, "tool_choice": rng.choice(_CHOICES),
              "max_tokens": rng.randint(6, 24), "temperature": 1.0, "seed": rng.randrange(2**31)}
    if stream:
        message, prompt_ids, sampled = await _assemble(
            await client.chat.completions.create(stream=True, **kwargs)
        )
    else:
        response = await client.chat.completions.create(**kwargs)
        message = response.choices[0].message.model_dump(exclude_none=True)
        prompt_ids, sampled = response.prompt_token_ids, response.choices[0].token_ids
    turn = Turn(prompt_ids=prompt_ids, completion_ids=sampled, logprobs=[0.0] * len(sampled))
    return message, turn


def _answers(message: dict[str, Any], rng: random.Random) -> list[dict[str, Any]]:
    """Tool results for each call, or a user nudge when the reply called nothing."""
    if not message.get("tool_calls"):
        return [
            {
                "role": "user",
                "content": rng.choice(["Go on.", "And then?", "Try the tool.", "Thanks! One more?"]),
            }
        ]
    return [{"role": "tool", "tool_call_id": c["id"], "content": json.dumps({"value": rng.randint(0, 999)})}
            for c in message["tool_calls"]]


async def run_episode(
    client: Any, rng: random.Random, turns: int, stream: bool, report: FidelityReport
) -> None:
    messages: list[Any] = [
        {"role": "system", "content": "You are a careful assistant. Use tools when they help."},
        {"role": "user", "content": f"Look up key {rng.choice('abcdef')} and add {rng.randint(1, 9)} to it."},
    ]
    recorded: list[Turn] = []
    prompt_sizes: list[int] = []
    last_reply = 0
    for _ in range(turns):
        message, turn = await _turn(client, messages, rng, stream)
        recorded.append(turn)
        prompt_sizes.append(len(messages))
        report.tool_call_turns += bool(message.get("tool_calls"))
        report.reasoning_turns += bool(message.get("reasoning_content"))
        messages.append(message)
        last_reply = len(messages)
        messages += _answers(message, rng)
    stats = SampleStats()
    turns_to_samples(recorded, advantage=0.0, reward=0.0, example_id=0, stats=stats)
    drift = client.measure_drift(messages[:last_reply])
    report.turns += len(recorded)
    report.ledger_breaks += stats.breaks
    report.drift_tokens += drift[0] if drift else 0
    report.drifted_turns += drift[1] if drift else 0
    report.streamed_episodes += stream
    for turn, size in zip(recorded, prompt_sizes, strict=True):
        _classify_drift(client.renderer, messages[:size], turn.prompt_ids, report)


def _classify_drift(
    renderer: Any, messages: list[Any], prompt_ids: list[int], report: FidelityReport
) -> None:
    """Whether a re-render of this turn's messages differs in text, or only in ids, from its prompt."""
    from bridges.envs.messages import to_message_dicts

    text = renderer.render_text(to_message_dicts(messages), TOOLS, True)
    if not renderer.decode(prompt_ids).startswith(text):  # a forced call's opener may follow the text
        report.rewritten_turns += 1
        return
    scratch = renderer.encode(text)
    if scratch != prompt_ids[: len(scratch)]:
        report.retokenized_turns += 1


async def run_fidelity(client: Any, family: str, episodes: int, turns: int = 4, seed: int = 0,
                       concurrency: int = 64) -> FidelityReport:
    """``episodes`` episodes of ``turns`` turns, ``concurrency`` at a time (so the engine batches them)."""
    report = FidelityReport(family)
    gate = asyncio.Semaphore(concurrency)

    async def one(index: int) -> None:
        async with gate:
            await run_episode(client, random.Random(seed * 1_000_003 + index), turns, index % 4 == 3, report)
            report.episodes += 1

    results = await asyncio.gather(*(one(i) for i in range(episodes)), return_exceptions=True)
    failures = [r for r in results if isinstance(r, BaseException)]
    if failures:
        raise RuntimeError(
            f"{len(failures)} of {episodes} episodes failed; the first: {failures[0]!r}"
        ) from failures[0]
    return report
