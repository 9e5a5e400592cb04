"""10,000 concurrent multi-turn rollouts through ``EngineClient`` over an engine with 20 ms latency.

    python benchmarks/rollout_scale.py [--rollouts 10000] [--turns 3] [--latency 0.02] [--phases]

The environment is the bundled ``guess_number`` game with ``max_turns=3``; the simulated engine
answers every turn after ``latency`` seconds with a reply that holds no number, so every rollout
plays exactly ``turns`` model turns (and gets the environment's hint in between). All rollouts
are in flight at once (``max_concurrent = rollouts``), so the latency-bound ideal is
``turns * latency`` seconds: what an infinitely fast client and environment would take. The gap to
it is this library's own cost per call (render, ledger, parse, environment step, scoring) times the
number of calls, on one event loop. Memory: the same rollouts run twice on one client with the
first wave's results dropped; RSS growth over the second wave, per finished rollout, is what a
long run would accumulate (the token ledger is bounded, LRU). The reported seconds are wave 1's.

``--phases`` adds a third, instrumented wave and prints CPU per model call by phase (render,
tokenizer, ledger, drift, responses, environment hooks, scoring, garbage collector; see
``benchmarks/phases.py``); the wrappers add their own cost, so compare phases, not the total.

Last line: rollouts=<int> seconds=<float> ideal_seconds=<float> efficiency=<ideal/seconds> peak_rss_mb=<float>
cpu_us_per_call=<float> (the process's CPU time over wave 1 per model call)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bridges.envs.types import Sample, SamplingParams  # noqa: E402

REPLY = "Let me think about it."


class LatencyEngine:
    """An Engine whose every call takes ``latency`` seconds of waiting (no CPU), like a remote server."""

    def __init__(self, tokenizer: Any, latency: float) -> None:
        self.tokenizer = tokenizer
        self.latency = latency
        self.max_model_len = 1 << 20
        self.weight_version = 0
        self.name = "latency"
        self.calls = 0
        self._ids = tokenizer.backend_tokenizer.encode(REPLY, add_special_tokens=False).ids + [
            tokenizer.eos_token_id
        ]

    async def aclose(self) -> None:  # nothing to release
        return None

    async def generate(self, prompt_ids: list[int], params: SamplingParams, n: int = 1) -> list[Sample]:
        self.calls += 1
        await asyncio.sleep(self.latency)
        return [Sample(list(self._ids), [-0.5] * len(self._ids), "stop") for _ in range(n)]


def rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


async def phase_wave(env: Any, rows: list[dict[str, Any]], client: Any, calls: int) -> list[str]:
    """One more wave with every phase's functions wrapped (benchmarks/phases.py)."""
    from benchmarks.phases import instrumented, report

    with instrumented() as timer:
        cpu_started = time.process_time()
        result = await env.generate(rows, client, "latency", max_concurrent=len(rows), progress=False)
        cpu = time.process_time() - cpu_started
    assert all(not s.errored for s in result.states)
    return report(timer, cpu, calls)


async def run(rollouts: int, turns: int, latency: float, phases: bool = False) -> None:
    import gc

    from bridges.client import EngineClient
    from bridges.envs.registry import load_environment
    from bridges.models.tiny import build_tiny_tokenizer

    env = load_environment("guess_number", num_train=rollouts, num_eval=1, max_turns=turns)
    rows = [dict(r) for r in env.get_dataset()]
    engine = LatencyEngine(build_tiny_tokenizer(), latency)
    client = EngineClient(engine, model_name="latency")
    rss = [rss_mb()]
    timings, cpu_seconds = [], []
    for _ in range(
        2
    ):  # the same 10,000 rollouts twice; the first wave's results are dropped before the second
        started, cpu_started = time.perf_counter(), time.process_time()
        result = await env.generate(rows, client, "latency", max_concurrent=rollouts, progress=False)
        timings.append(time.perf_counter() - started)
        cpu_seconds.append(time.process_time() - cpu_started)
        assert len(result.states) == rollouts
        assert all(len(s.turns) == turns and not s.errored for s in result.states)
        del result
        gc.collect()
        rss.append(rss_mb())
    seconds = timings[0]
    ideal = turns * latency
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    per_call_us = seconds / (rollouts * turns) * 1e6
    print(
        f"{rollouts} rollouts x {turns} turns = {rollouts * turns} engine calls of {latency * 1000:.0f} ms, all in flight at once"
    )
    print(
        f"wave 1 {timings[0]:.2f} s, wave 2 {timings[1]:.2f} s vs the latency-bound ideal {ideal:.2f} s: "
        f"{per_call_us:.0f} us of client + environment CPU per call on one event loop"
    )
    print(
        f"RSS {rss[0]:.0f} MB at start -> {rss[1]:.0f} MB after wave 1 -> {rss[2]:.0f} MB after wave 2 (results "
        f"dropped after each): {(rss[2] - rss[1]) * 1024 / rollouts:.1f} KB per finished rollout in wave 2; the "
        f"ledger holds {len(client.ledger)} turns (bounded at its capacity, LRU)"
    )
    if phases:
        print("CPU per model call by phase (instrumented wave 3):")
        print("\n".join(await phase_wave(env, rows, client, rollouts * turns)))
    print(
        f"rollouts={rollouts} seconds={seconds:.3f} ideal_seconds={ideal:.3f} efficiency={ideal / seconds:.4f} "
        f"peak_rss_mb={peak:.1f} cpu_us_per_call={cpu_seconds[0] / (rollouts * turns) * 1e6:.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=10_000)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--latency", type=float, default=0.02)
    parser.add_argument("--phases", action="store_true", help="add an instrumented wave: CPU by phase")
    args = parser.parse_args()
    asyncio.run(run(args.rollouts, args.turns, args.latency, args.phases))


if __name__ == "__main__":
    main()
