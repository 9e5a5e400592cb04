"""Re-score saved traces with an environment's current rubric (``python -m bridges.rescore``): the
episodes are not re-run, only scored again, and before/after rewards are written side by side.
"""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bridges.envs.types import StopReason
from bridges.runs.config import option
from bridges.runtime.errors import ConfigError


@dataclass
class RescoreConfig:
    traces: str = option("", help="a traces.jsonl.gz (or eval results.jsonl) to score again")
    env: str = option("", help="the environment whose rubric scores them")
    env_args: dict[str, Any] = option(
        factory=dict, help="keyword arguments of the environment's load_environment"
    )
    output: str | None = option(None, help="where the rescored records go; default <traces>.rescored.jsonl")


async def rescore(records: list[dict[str, Any]], env: Any) -> list[dict[str, Any]]:
    """New records (same order) with ``reward``/``metrics`` from ``env``'s rubric and ``reward_before``."""
    from bridges.envs.results import record_to_state, state_to_record

    states = []
    for record in records:
        state = record_to_state(record)
        if state.stop_reason == StopReason.REWARD_ERROR:
            state.stop_reason, state.error = None, None
        state.reward, state.metrics = None, {}
        states.append(state)
    groups: dict[tuple[Any, int], list[int]] = defaultdict(list)
    for index, record in enumerate(records):
        groups[(record.get("provenance", {}).get("step"), record["example_id"])].append(index)
    for indices in groups.values():
        await env.rubric.score_group([states[i] for i in indices])
    out = []
    for record, state in zip(records, states, strict=True):
        new = {**state_to_record(state), "reward_before": record.get("reward")}
        if "provenance" in record:
            new["provenance"] = record["provenance"]
        out.append(new)
    return out


def rescore_traces(config: RescoreConfig) -> int:
    """Score saved episodes again with the environment's current rubric; write before/after side by side."""
    from bridges.envs.registry import load_environment
    from bridges.workflows.traces import read_traces

    if not config.traces or not config.env:
        raise ConfigError(
            "both traces=<file> and env=<id> are required, e.g. traces=runs/x/traces.jsonl.gz env=reverse_text."
        )
    path = Path(config.traces)
    if not path.exists():
        raise ConfigError(f"traces file '{path}' does not exist.")
    if config.env.startswith("vf:"):
        from bridges.adapters.verifiers.environment import VerifiersEnvironment

        raise ConfigError(VerifiersEnvironment.rescore_refusal or "")
    env = load_environment(config.env, **config.env_args)
    if env.rescore_refusal:
        raise ConfigError(env.rescore_refusal)
    records = list(read_traces(path))
    rescored = asyncio.run(rescore(records, env))
    output = Path(config.output) if config.output else path.with_suffix(".rescored.jsonl")
    output.write_text("".join(json.dumps(r) + "\n" for r in rescored))
    before = [r["reward_before"] for r in rescored if r["reward_before"] is not None]
    after = [r["reward"] for r in rescored if r["reward"] is not None]
    changed = sum(
        1
        for r in rescored
        if r["reward"] is not None
        and r["reward_before"] is not None
        and abs(r["reward"] - r["reward_before"]) > 1e-9
    )
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
    print(f"rescored {len(rescored)} episodes from {path} with env '{config.env}'")
    print(
        f"mean reward before {mean(before):.4f} ({len(before)} scored) -> after {mean(after):.4f} ({len(after)} scored); {changed} changed"
    )
    print(f"written to {output}")
    return 0
