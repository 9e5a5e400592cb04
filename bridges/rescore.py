"""``python -m bridges.rescore traces=<file> env=<id>``: score saved episodes again with the current rubric.

Rewards are a function of the rollout, not of the run: after fixing or changing a reward function,
re-scoring the traces a run already paid for answers "what would the reward have been" without
generating anything. Episodes are re-grouped by (step, example) so group reward functions see the
same groups they saw in training. Rollouts that failed before scoring stay failed; rollouts that
failed only in scoring are scored again.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bridges.config import option, parse_config, run_cli
from bridges.errors import ConfigError
from bridges.types import StopReason


@dataclass
class RescoreConfig:
    traces: str = option("", help="a traces.jsonl (or eval results.jsonl) to score again")
    env: str = option("", help="the environment whose rubric scores them")
    env_args: dict[str, Any] = option(
        factory=dict, help="keyword arguments of the environment's load_environment"
    )
    output: str | None = option(None, help="where the rescored records go; default <traces>.rescored.jsonl")


async def rescore(records: list[dict[str, Any]], env: Any) -> list[dict[str, Any]]:
    """New records (same order) with ``reward``/``metrics`` from ``env``'s rubric and ``reward_before``."""
    from bridges.results import record_to_state, state_to_record

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


def main(argv: list[str] | None = None) -> int:
    from bridges.registry import load_environment
    from bridges.workflows.traces import read_traces

    config = parse_config(RescoreConfig, sys.argv[1:] if argv is None else argv)
    if not config.traces or not config.env:
        raise ConfigError(
            "both traces=<file> and env=<id> are required, e.g. traces=runs/x/traces.jsonl env=reverse_text."
        )
    path = Path(config.traces)
    if not path.exists():
        raise ConfigError(f"traces file '{path}' does not exist.")
    env = load_environment(config.env, **config.env_args)
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


def cli() -> None:
    """Console-script entry point: errors print as one sentence and exit 2, as with ``python -m``."""
    run_cli(main)


if __name__ == "__main__":
    run_cli(main)
