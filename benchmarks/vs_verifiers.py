"""Peer benchmark: the same multi-turn game on verifiers 0.3.1's own loop and on ours, 20 ms engine.

    python benchmarks/vs_verifiers.py [--rollouts 1000,10000] [--turns 3] [--latency 0.02]

One game (the model guesses a number; the environment answers "higher"/"lower"; the simulated model
never names a number, so every rollout plays exactly ``turns`` turns), written twice: as a verifiers
0.3 ``MultiTurnEnv`` and as our native ``MultiTurnEnv``. Behind every path is the same simulated
engine: ``latency`` seconds of waiting, zero CPU, the same reply.
- (a) the peer: verifiers' own ``generate`` with the stock ``AsyncOpenAI`` (wrapped in its
  ``OpenAIChatCompletionsClient``) over an in-process HTTP transport that answers with the reply's
  ChatCompletion JSON after ``latency``;
- (b) our native environment on ``EngineClient`` (token ledger, ids and logprobs kept);
- (c) the verifiers environment through our verifiers adapter on ``EngineClient``.
All rollouts are in flight at once. CPU per call is the process's CPU time over the run divided by
the model calls; the ratio compares rollouts per second.

Last line (at the largest size): bridges_rollouts_per_s=<f> verifiers_rollouts_per_s=<f> ratio=<b/a>
vf_adapter_ratio=<c/a> cpu_us_per_call=<b's>
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from typing import Any

import httpx2

REPLY = "Let me think about it."
SYSTEM = "Guess the secret number between 1 and 100. Answer with a number."


def _hint(messages: list[Any], answer: str) -> str:
    last = messages[-1]
    text = (last.get("content") if isinstance(last, dict) else getattr(last, "content", None)) or ""
    digits = "".join(ch for ch in text if ch.isdigit())
    if not digits:
        return "That is not a number. Guess again."
    return "higher" if int(digits) < int(answer) else "lower"


def rows(count: int) -> list[dict[str, Any]]:
    rng = random.Random(0)
    return [{"question": "Guess the number.", "answer": str(rng.randint(1, 100))} for _ in range(count)]


def vf_environment(count: int, turns: int) -> Any:
    import verifiers as vf
    from datasets import Dataset

    class GuessGame(vf.MultiTurnEnv):
        async def env_response(self, messages, state, **kwargs):
            # verifiers 0.3's own advice: its message types, not dicts (dicts are re-validated each turn)
            return [vf.UserMessage(content=_hint(messages, state["answer"]))]

    def solved(completion, answer, **kwargs) -> float:
        return float(answer in (completion[-1].get("content") or ""))

    return GuessGame(dataset=Dataset.from_list(rows(count)), system_prompt=SYSTEM, max_turns=turns,
                     rubric=vf.Rubric(funcs=[solved]), sampling_args={"max_tokens": 16})


def native_environment(count: int, turns: int) -> Any:
    from datasets import Dataset

    import bridges as br

    class GuessGame(br.MultiTurnEnv):
        async def env_response(self, messages, state):
            return [{"role": "user", "content": _hint(messages, state["answer"])}]

    def solved(completion, answer) -> float:
        return float(answer in (completion[-1].get("content") or ""))

    return GuessGame(dataset=Dataset.from_list(rows(count)), system_prompt=SYSTEM, max_turns=turns,
                     rubric=br.Rubric(funcs=[solved]), sampling_args={"max_tokens": 16})


class SimulatedHTTP(httpx2.AsyncBaseTransport):
    """What the stock SDK reaches: a chat completion after ``latency`` seconds, serialised once."""

    def __init__(self, latency: float) -> None:
        self.latency, self.calls = latency, 0
        self.body = json.dumps({
            "id": "chatcmpl-sim", "object": "chat.completion", "created": 0, "model": "sim",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": REPLY}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 50, "completion_tokens": 7, "total_tokens": 57},
        }).encode()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        self.calls += 1
        await request.aread()
        await asyncio.sleep(self.latency)
        return httpx2.Response(
            200, headers={"content-type": "application/json"}, content=self.body, request=request
        )


def engine_client(latency: float) -> Any:
    from rollout_scale import LatencyEngine

    from bridges.client import EngineClient
    from bridges.models.tiny import build_tiny_tokenizer

    engine = LatencyEngine(build_tiny_tokenizer(), latency)
    engine._ids = engine.tokenizer.backend_tokenizer.encode(REPLY, add_special_tokens=False).ids + [
        engine.tokenizer.eos_token_id
    ]
    return EngineClient(engine, model_name="sim"), engine


async def timed(run: Any) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    await run()
    return time.perf_counter() - wall, time.process_time() - cpu


async def measure(count: int, turns: int, latency: float) -> dict[str, tuple[float, float, int]]:
    import openai
    import verifiers as vf

    from bridges.adapters.verifiers.environment import VerifiersEnvironment

    out: dict[str, tuple[float, float, int]] = {}
    transport = SimulatedHTTP(latency)
    stock = openai.AsyncOpenAI(api_key="sim", base_url="http://sim.invalid/v1", max_retries=0,
                               http_client=httpx2.AsyncClient(transport=transport, timeout=None))
    peer = vf_environment(count, turns)
    inputs = [{"prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": r["question"]}],
               "answer": r["answer"], "example_id": i, "info": {}} for i, r in enumerate(rows(count))]
    wall, cpu = await timed(lambda: peer.generate(inputs, vf.OpenAIChatCompletionsClient(stock), "sim",
                                                  max_concurrent=count))
    out["verifiers"] = (wall, cpu, transport.calls)
    client, engine = engine_client(latency)
    native = native_environment(count, turns)
    data = [dict(r) for r in native.get_dataset()]
    wall, cpu = await timed(
        lambda: native.generate(data, client, "sim", max_concurrent=count, progress=False)
    )
    out["bridges"] = (wall, cpu, engine.calls)
    client, engine = engine_client(latency)
    adapted = VerifiersEnvironment(vf_environment(count, turns))
    data = [dict(r) for r in adapted.get_dataset()]
    wall, cpu = await timed(
        lambda: adapted.generate(data, client, "sim", max_concurrent=count, progress=False)
    )
    out["vf_adapter"] = (wall, cpu, engine.calls)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", default="1000,10000")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--latency", type=float, default=0.02)
    args = parser.parse_args()
    last: dict[str, tuple[float, float, int]] = {}
    for count in (int(x) for x in args.rollouts.split(",")):
        last = asyncio.run(measure(count, args.turns, args.latency))
        for name, (wall, cpu, calls) in last.items():
            print(f"{count:>6} rollouts  {name:<10} {wall:7.2f} s  {count / wall:8.1f} rollouts/s  "
                  f"{cpu / max(1, calls) * 1e6:7.0f} us CPU per call ({calls} calls)", flush=True)
    rate = {name: count / wall for name, (wall, _, _) in last.items()}
    b_wall, b_cpu, b_calls = last["bridges"]
    print(f"bridges_rollouts_per_s={rate['bridges']:.1f} verifiers_rollouts_per_s={rate['verifiers']:.1f} "
          f"ratio={rate['bridges'] / rate['verifiers']:.2f} vf_adapter_ratio={rate['vf_adapter'] / rate['verifiers']:.2f} "
          f"cpu_us_per_call={b_cpu / max(1, b_calls) * 1e6:.1f}")


if __name__ == "__main__":
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
