"""Per-call overhead of EngineClient vs the stock OpenAI SDK, with an engine that costs nothing.

    python benchmarks/client_overhead.py [conversations=200] [turns=3] [rounds=5]

Both clients run the SAME sequence of chat calls: ``conversations`` conversations of ``turns``
turns each, the assistant reply fed back every turn (so EngineClient's ledger extends the
conversation, with its bridge render, on every turn after the first). Behind both is a
zero-latency engine with the tiny tokenizer:
- (a) ``EngineClient(ZeroLatencyEngine)``: the in-process fast path, ledger included;
- (b) ``openai.AsyncOpenAI`` over an in-process ``httpx.AsyncClient(transport=MockTransport)``
  that answers with the equivalent ChatCompletion JSON (same extras), pre-serialised: the SDK pays
  only its own request transform, HTTP plumbing and response parsing.
Each client is warmed up, then both are timed in alternating rounds over fresh conversations (no
state repeats between rounds); the per-call figure is the median round. The last line is
``client_overhead_us=<float> sdk_overhead_us=<float> ratio=<sdk/client>``.

The reported figure is the process's CPU time per call (``time.process_time``): everything here is
in-process and single-threaded, so on a quiet machine it equals wall time, and on a shared machine
(other jobs competing for the cores) it still measures this code's own cost. Wall time per call
and the load average are printed too.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from typing import Any

from bridges.envs.types import Sample, SamplingParams
from bridges.models.tiny import build_tiny_tokenizer

REPLY = "The answer is 5."


class ZeroLatencyEngine:
    """An Engine that returns one fixed sample instantly: all measured time is client overhead."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = 4096
        self.weight_version = 0
        self.name = "zero-latency"
        self._ids = tokenizer.backend_tokenizer.encode(REPLY, add_special_tokens=False).ids + [
            tokenizer.eos_token_id
        ]
        self._logprobs = [-0.5] * len(self._ids)

    async def aclose(self) -> None:  # nothing to release
        return None

    async def generate(self, prompt_ids: list[int], params: SamplingParams, n: int = 1) -> list[Sample]:
        return [Sample(list(self._ids), list(self._logprobs), "stop") for _ in range(n)]


def conversation_turns(index: int, turns: int) -> list[str]:
    return [
        f"Question {index}.{turn}: what is {index} plus {turn}? Answer with a number."
        for turn in range(turns)
    ]


async def run_conversations(client: Any, start: int, count: int, turns: int) -> int:
    """``count`` conversations of ``turns`` turns each, replies fed back; returns the number of calls."""
    calls = 0
    for index in range(start, start + count):
        messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful calculator."}]
        for text in conversation_turns(index, turns):
            messages.append({"role": "user", "content": text})
            response = await client.chat.completions.create(
                model="bench", messages=messages, max_tokens=64, temperature=1.0
            )
            messages.append({"role": "assistant", "content": response.choices[0].message.content})
            calls += 1
    return calls


def make_sdk_client(canned_json: bytes) -> Any:
    import httpx
    import openai

    headers = {"content-type": "application/json"}

    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=canned_json, headers=headers)

    http_client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return openai.AsyncOpenAI(
        api_key="bench", base_url="http://bench.invalid/v1", http_client=http_client, max_retries=0
    )


async def timed(client: Any, start: int, count: int, turns: int) -> tuple[float, float]:
    """(CPU seconds, wall seconds) per call over ``count`` fresh conversations."""
    cpu0, wall0 = time.process_time(), time.perf_counter()
    calls = await run_conversations(client, start, count, turns)
    return (time.process_time() - cpu0) / calls, (time.perf_counter() - wall0) / calls


async def breakdown(client: Any, start: int, count: int, turns: int) -> dict[str, float]:
    """us per call spent in the tokenizer, the template and model_validate: an instrumented pass (wall
    clock, cheaper to read than CPU time) run after the timed rounds, so it never touches the figures."""
    import bridges.client.engine_client as engine_client

    spent = {"tokenize": 0.0, "render": 0.0, "validate": 0.0}
    renderer = client.renderer

    def timed_call(name: str, func: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return func(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - t0

        return wrapper

    saved = renderer.encode, renderer.render_text, engine_client.validate_with_ids
    renderer.encode = timed_call("tokenize", saved[0])
    renderer.render_text = timed_call("render", saved[1])
    engine_client.validate_with_ids = timed_call("validate", saved[2])
    try:
        calls = await run_conversations(client, start, count, turns)
    finally:
        renderer.encode, renderer.render_text, engine_client.validate_with_ids = saved
    return {name: seconds / calls * 1e6 for name, seconds in spent.items()}


async def main(conversations: int, turns: int, rounds: int) -> None:
    from bridges.client import EngineClient

    tokenizer = build_tiny_tokenizer()
    client = EngineClient(ZeroLatencyEngine(tokenizer), model_name="bench")
    # the SDK's canned answer is what EngineClient answers for a mid-conversation turn, extras included
    probe = await client.chat.completions.create(
        model="bench", messages=[{"role": "user", "content": conversation_turns(0, 1)[0]}]
    )
    sdk = make_sdk_client(probe.model_dump_json(exclude_unset=True).encode())

    start = 10_000_000  # fresh conversation indices for every round: no ledger state repeats
    for c in (client, sdk):  # warm-up: imports, caches, the SDK's lazy model builds
        await run_conversations(c, start, 20, turns)
    start += 20
    ours: list[tuple[float, float]] = []
    theirs: list[tuple[float, float]] = []
    for _ in range(rounds):  # both clients get the same calls; every round uses new conversations
        ours.append(await timed(client, start, conversations, turns))
        theirs.append(await timed(sdk, start, conversations, turns))
        start += conversations
    client_us = statistics.median(cpu for cpu, _ in ours) * 1e6
    sdk_us = statistics.median(cpu for cpu, _ in theirs) * 1e6
    prompt_len = len(probe.prompt_token_ids)
    print(f"{conversations} conversations x {turns} turns per round, {rounds} rounds, median round reported")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; per call, CPU us (wall us):")
    print(f"  EngineClient rounds: {', '.join(f'{c * 1e6:.1f} ({w * 1e6:.1f})' for c, w in ours)}")
    print(f"  stock SDK rounds:    {', '.join(f'{c * 1e6:.1f} ({w * 1e6:.1f})' for c, w in theirs)}")
    parts = await breakdown(client, start, conversations, turns)
    print(
        f"EngineClient per call: a full render on turn 1, a ledger bridge (only the new messages) after; "
        f"first-turn prompt {prompt_len} tokens, ledger now {len(client.ledger)} turns"
    )
    print(
        "  of which (instrumented pass, us): "
        + ", ".join(f"{name} {value:.1f}" for name, value in parts.items())
        + f", the rest (ledger, argument checks, decode, timer, dict building) {client_us - sum(parts.values()):.1f}"
    )
    print(f"client_overhead_us={client_us:.1f} sdk_overhead_us={sdk_us:.1f} ratio={sdk_us / client_us:.1f}")


if __name__ == "__main__":
    args = dict(arg.split("=", 1) for arg in sys.argv[1:])
    asyncio.run(
        main(int(args.get("conversations", 200)), int(args.get("turns", 3)), int(args.get("rounds", 5)))
    )
