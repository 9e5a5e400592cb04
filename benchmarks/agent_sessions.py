"""What a session costs per model call, against calling ``EngineClient`` in-process, with an engine that
costs nothing.

    python benchmarks/agent_sessions.py [calls=300] [rounds=3]

Five ways to make the same two-turn conversation's calls: (a) ``EngineClient`` directly (what a
native environment does); (b) the openai SDK on a session in-process, without a socket
(``bridges.agents.in_process``, what the verifiers adapter does); (c) the openai SDK over a loopback
session (Chat Completions), (d) the same over the Responses route, (e) the anthropic SDK over the
Messages route. Every call samples
the same fixed reply (``client_overhead.ZeroLatencyEngine``), so the time is the path's own: the
HTTP round trip, parsing, recording and, for (c) and (d), the translation. Rounds alternate the
paths; each figure is the median round's wall time per call. The last line is
``direct_us=… in_process_us=… chat_us=… responses_us=… messages_us=… in_process_ratio=… chat_ratio=…``.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from client_overhead import ZeroLatencyEngine  # noqa: E402

from bridges.agents.in_process import session_client  # noqa: E402
from bridges.agents.loopback import LoopbackServer  # noqa: E402
from bridges.client import EngineClient  # noqa: E402
from bridges.models.tiny import build_tiny_tokenizer  # noqa: E402


async def conversation(ask: Any, i: int) -> None:
    """Two calls, the second extending the first (as an agent's would)."""
    first = [{"role": "user", "content": f"Question {i}: what is {i} plus 1?"}]
    reply = await ask(first)
    await ask([*first, {"role": "assistant", "content": reply}, {"role": "user", "content": "Sure?"}])


def askers(client: EngineClient, server: LoopbackServer) -> dict[str, Any]:
    import anthropic
    import openai

    session = server.sessions.open(client, "tiny", {"max_tokens": 16}, max_calls=10**9, max_sampled_tokens=10**12)
    sdk = openai.AsyncOpenAI(base_url=server.base_url(session), api_key="k", max_retries=0)
    claude = anthropic.AsyncAnthropic(base_url=server.session_root(session), api_key="k", max_retries=0)
    local = session_client(server.sessions, session)

    async def direct(messages: Any) -> str:
        r = await client.chat.completions.create(model="tiny", messages=messages, max_tokens=16)
        return r.choices[0].message.content or ""

    async def in_process(messages: Any) -> str:
        r = await local.chat.completions.create(model="tiny", messages=messages, max_tokens=16)
        return r.choices[0].message.content or ""

    async def chat(messages: Any) -> str:
        r = await sdk.chat.completions.create(model="tiny", messages=messages, max_tokens=16)
        return r.choices[0].message.content or ""

    async def responses(messages: Any) -> str:
        return (await sdk.responses.create(model="tiny", input=messages, max_output_tokens=16)).output_text

    async def messages_route(messages: Any) -> str:
        r = await claude.messages.create(model="tiny", max_tokens=16, messages=messages)
        return "".join(b.text for b in r.content if b.type == "text")

    return {"direct": direct, "in_process": in_process, "chat": chat, "responses": responses, "messages": messages_route}


async def main(calls: int, rounds: int) -> None:
    client = EngineClient(ZeroLatencyEngine(build_tiny_tokenizer()), model_name="tiny")
    server = LoopbackServer()
    await server.start()
    paths = askers(client, server)
    timings: dict[str, list[float]] = {name: [] for name in paths}
    for round_ in range(rounds + 1):  # round 0 warms every path up and is not counted
        for name, ask in paths.items():
            started = time.perf_counter()
            for i in range(calls // 2):
                await conversation(ask, round_ * calls + i)
            if round_:
                timings[name].append((time.perf_counter() - started) / calls * 1e6)
    await server.aclose()
    medians = {name: statistics.median(values) for name, values in timings.items()}
    for name, values in timings.items():
        print(f"{name:10s} " + " ".join(f"{v:8.0f}" for v in values) + " us/call")
    print(" ".join(f"{name}_us={value:.0f}" for name, value in medians.items())
          + f" in_process_ratio={medians['in_process'] / medians['direct']:.2f}"
          + f" chat_ratio={medians['chat'] / medians['direct']:.2f}")


if __name__ == "__main__":
    args = dict(arg.split("=", 1) for arg in sys.argv[1:])
    asyncio.run(main(int(args.get("calls", 300)), int(args.get("rounds", 3))))
