"""Rollout records -> a supervised dataset of exactly the tokens that were sampled.

Supervised warm-up on rollouts is only as good as its tokens: re-rendering the messages with the
chat template would train on a tokenisation the policy never produced (and, for templates that
rewrite history, on text it never saw). So each row carries the chat messages *and* the token ids
and assistant mask of the rollout's training sample (``workflows.samples``: 1 exactly on sampled
ids), and ``bridges.sft`` trains on the ids. Rollouts that cannot be trained on (errored, unscored,
or from an endpoint that returned no ids) are never exported.

Filters, applied in this order: ``min_reward``, ``metric`` >= ``min_metric``, the ``top_k`` best
rollouts of each example by reward, then ``dedupe`` (identical token ids kept once).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bridges.envs.results import message_record, record_to_state
from bridges.workflows.samples import SampleStats, state_to_samples
from bridges.workflows.traces import read_traces


@dataclass(frozen=True)
class ExportFilter:
    min_reward: float | None = None
    metric: str | None = None
    min_metric: float | None = None
    top_k: int | None = None
    dedupe: bool = True


@dataclass
class ExportReport:
    read: int = 0
    untrainable: int = 0
    below_reward: int = 0
    below_metric: int = 0
    beyond_top_k: int = 0
    duplicates: int = 0
    rows: int = 0


def read_records(path: Path) -> list[dict[str, Any]]:
    """Records from a ``results.jsonl`` / ``traces.jsonl`` file, or the one such file in a folder."""
    if path.is_dir():
        found = [path / name for name in ("results.jsonl", "traces.jsonl.gz", "traces.jsonl") if (path / name).is_file()]
        if not found:
            raise FileNotFoundError(f"{path} holds no results.jsonl or traces.jsonl.gz")
        path = found[0]
    return list(read_traces(path))  # results and traces share the record format and the reader


def _keep(state: Any, rule: ExportFilter, report: ExportReport) -> bool:
    if not state.trainable:
        report.untrainable += 1
        return False
    if rule.min_reward is not None and state.reward < rule.min_reward:
        report.below_reward += 1
        return False
    if rule.metric is not None and state.metrics.get(rule.metric, float("-inf")) < (rule.min_metric or 0.0):
        report.below_metric += 1
        return False
    return True


def _top_k(states: list[Any], k: int | None, report: ExportReport) -> list[Any]:
    if k is None:
        return states
    by_example: dict[tuple[Any, int], list[Any]] = defaultdict(list)
    for state in states:
        by_example[(state.task, state.example_id)].append(state)
    kept = []
    for group in by_example.values():
        best = sorted(group, key=lambda s: -s.reward)[:k]
        report.beyond_top_k += len(group) - len(best)
        kept += best
    return kept


def sft_rows(
    records: Iterable[dict[str, Any]], rule: ExportFilter
) -> tuple[list[dict[str, Any]], ExportReport]:
    """The dataset rows for ``records`` under ``rule``, and what was dropped for which reason."""
    report = ExportReport()
    states = []
    for record in records:
        report.read += 1
        state = record_to_state(record)
        if _keep(state, rule, report):
            states.append(state)
    rows, seen = [], set()
    for state in _top_k(states, rule.top_k, report):
        for sample in state_to_samples(state, advantage=0.0, stats=SampleStats()):
            key = tuple(sample.token_ids)
            if rule.dedupe and key in seen:
                report.duplicates += 1
                continue
            seen.add(key)
            rows.append({
                "messages": [message_record(m) for m in [*state.prompt, *state.completion]],
                "input_ids": list(sample.token_ids),
                "assistant_masks": list(sample.loss_mask),
                "reward": float(state.reward),
                "example_id": state.example_id,
                "task": state.task,
            })
    report.rows = len(rows)
    return rows, report
