"""verifiers v1 rollouts per second: through rl-bridges against verifiers' own evaluation path.

    python benchmarks/v1_rollouts.py [--rollouts 64] [--repeats 3] [--model tiny]

One offline taskset (the bundled ``repeat_letter_taskset``, six-token replies) and one engine (the
tiny model on the hf engine, ``EngineClient``; ``--model tiny-qwen2.5`` puts Qwen2.5's 151,936-word
head on it, whose forward pass costs what a small real model's does), all rollouts in flight at once:
- (a) verifiers' own evaluation path: its ``Env.serving``/``run_slot`` with the agent on its ``null``
  harness as verifiers runs it — one program per rollout in the ``subprocess`` runtime (through ``uv``,
  which must be on PATH with the package index reachable; the first rollout warms uv's cache and is
  not timed) — its ``EvalClient`` calling the engine served by ``bridges.serve`` on loopback;
- (b) rl-bridges: the same taskset through ``V1Environment`` (the seat in-process, our per-session
  endpoint), token ids kept;
- (c) the same task written natively (``repeat_letter``) on the same engine, for scale;
- (d, e) the agent on verifiers' ``bash`` program harness instead, its ``uv`` program per rollout on the
  ``subprocess`` runtime: through rl-bridges (``V1Environment``, ``v1_programs``) and through verifiers'
  own path (needs uv; the first of each warms uv and is not timed).
Each run is one event loop, whose first rollout on each path is not timed (it opens that loop's
serving, or warms uv): what a training run, which keeps its loop, pays per rollout. Each figure is
the median of ``--repeats`` runs in this process. Last line:
``bridges_rollouts_per_s=<b> verifiers_rollouts_per_s=<a> ratio=<b/a> native_rollouts_per_s=<c>
program_bridges_rollouts_per_s=<d> program_verifiers_rollouts_per_s=<e> program_ratio=<d/e>``
(verifiers' and the program figures ``n/a`` without uv). Goal: ratio ≥ 1; program_ratio ≥ 1.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import time
from typing import Any


async def ours(env: Any, client: Any, count: int) -> float:
    """``count`` rollouts of ``env`` at once, launched as every backend launches a batch (``run_groups``:
    a seed per row, the rollout-time collector policy)."""
    from bridges.workflows.rollouts import run_group, run_groups

    rows = [dict(env.get_dataset()[i % 64]) for i in range(count)]
    await run_group(env, rows[0], client, 1, {"seed": count}, model="tiny")  # opens the loop's serving: not timed
    started = time.perf_counter()
    groups = await run_groups(env, rows, client, 1, {"seed": 0}, model="tiny")
    elapsed = time.perf_counter() - started
    assert all(g.states[0].error is None for g in groups), [g.states[0].error for g in groups][:1]
    return count / elapsed


async def verifiers_own(base_url: str, count: int, harness: str = "null") -> float:
    """verifiers' evaluation of the same taskset: its ``harness`` program per rollout, its EvalClient."""
    from verifiers.v1.clients import ModelContext
    from verifiers.v1.configs.client import EvalClientConfig
    from verifiers.v1.env import RunSlot
    from verifiers.v1.utils.loaders import load_environment, resolve_env_config

    from bridges.adapters.verifiers.v1_load import make_visible
    from bridges.environments import repeat_letter_taskset

    config = resolve_env_config({"taskset": {"id": make_visible(repeat_letter_taskset)},
                                 "agent": {"harness": {"id": harness}, "runtime": {"type": "subprocess"}}})
    env = load_environment(config)
    tasks = list(env.taskset)
    os.environ["BENCH_V1_KEY"] = "unused"
    ctx = ModelContext("tiny", EvalClientConfig(base_url=base_url, api_key_var="BENCH_V1_KEY"))
    async with env.serving():
        warm = await env.run_slot(RunSlot(tasks[0]), ctx)  # uv resolves the program's packages once
        assert warm.ok, warm.errors or warm.traces[0].errors
        started = time.perf_counter()
        episodes = await asyncio.gather(
            *[env.run_slot(RunSlot(tasks[i % len(tasks)]), ctx) for i in range(count)]
        )
        elapsed = time.perf_counter() - started
    assert all(e.ok for e in episodes), [e.errors or e.traces[0].errors for e in episodes if not e.ok][:1]
    return count / elapsed


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.1f}" if values else "n/a"


def _ratio(ours_values: list[float], theirs: list[float]) -> str:
    return f"{statistics.median(ours_values) / statistics.median(theirs):.2f}" if ours_values and theirs else "n/a"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default="tiny", help="the engine's model: tiny, or a tiny-<family> with a real vocabulary")
    args = parser.parse_args()
    from bridges.adapters.hf import HFEngine
    from bridges.client import EngineClient
    from bridges.envs.registry import load_environment
    from bridges.models.tiny import resolve_model_path
    from bridges.server.app import serve_in_thread

    client = EngineClient(HFEngine.from_pretrained(resolve_model_path(args.model)), model_name="tiny")
    v1, native = load_environment("repeat_letter_taskset"), load_environment("repeat_letter")
    program = load_environment("repeat_letter_taskset", agent={"harness": {"id": "bash"}}) if shutil.which("uv") else None
    f: dict[str, list[float]] = {"bridges": [], "verifiers": [], "native": [], "program_bridges": [],
                                 "program_verifiers": []}
    with serve_in_thread(client) as server:
        if program is not None:
            asyncio.run(ours(program, client, 1))  # the program's first start, as verifiers' warm-up
        for _ in range(args.repeats):
            f["bridges"].append(asyncio.run(ours(v1, client, args.rollouts)))
            f["native"].append(asyncio.run(ours(native, client, args.rollouts)))
            if program is not None:
                f["verifiers"].append(asyncio.run(verifiers_own(server.base_url, args.rollouts)))
                f["program_bridges"].append(asyncio.run(ours(program, client, args.rollouts)))
                f["program_verifiers"].append(asyncio.run(verifiers_own(server.base_url, args.rollouts, "bash")))
    for name, values in f.items():
        if values:
            print(f"{name:18s} rollouts/s: " + ", ".join(f"{v:.1f}" for v in values), flush=True)
    print(f"bridges_rollouts_per_s={_median(f['bridges'])} verifiers_rollouts_per_s={_median(f['verifiers'])} "
          f"ratio={_ratio(f['bridges'], f['verifiers'])} native_rollouts_per_s={_median(f['native'])} "
          f"program_bridges_rollouts_per_s={_median(f['program_bridges'])} "
          f"program_verifiers_rollouts_per_s={_median(f['program_verifiers'])} "
          f"program_ratio={_ratio(f['program_bridges'], f['program_verifiers'])}")


if __name__ == "__main__":
    main()
