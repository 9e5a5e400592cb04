"""What every training backend does around a batch: which rows come next, which samples train, what to log.

The data order is a seeded permutation per epoch addressed by a position, so a checkpoint only has to
store that position to resume exactly. ``groups_to_samples`` keeps what carries signal (masked
members and groups without reward variance cost no compute) and ``step_metrics`` is the per-step
row every backend writes to ``metrics.jsonl``, so runs compare across backends key for key.
"""

from __future__ import annotations

import functools
import random
from collections import Counter
from typing import Any

from bridges.workflows.samples import SampleStats, state_to_samples, truncate_sample
from bridges.workflows.types import Group, TrainingSample


@functools.lru_cache(maxsize=4)
def _epoch_order(size: int, seed: int, epoch: int) -> tuple[int, ...]:
    order = list(range(size))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return tuple(order)


def rows_at(dataset: Any, position: int, count: int, seed: int) -> list[dict[str, Any]]:
    size = len(dataset)
    rows = []
    for pos in range(position, position + count):
        epoch, offset = divmod(pos, size)
        rows.append(dataset[_epoch_order(size, seed, epoch)[offset]])
    return rows


def groups_to_samples(
    groups: list[Group], max_completion_length: int
) -> tuple[list[TrainingSample], SampleStats]:
    """Samples of the groups that carry signal; masked and no-signal members cost no compute."""
    stats = SampleStats()
    samples: list[TrainingSample] = []
    for group in groups:
        if not group.contributes_gradient:
            continue
        for state, advantage in zip(group.states, group.advantages, strict=True):
            if state.trainable and advantage != 0.0:
                for sample in state_to_samples(state, advantage, stats):
                    samples.append(truncate_sample(sample, sample.prompt_length + max_completion_length))
    return samples, stats


def batch_seed(seed: int, step: int) -> int:
    """The sampling seed of one step's batch: a function of the run's seed and the step alone, so a
    resumed run samples step k exactly as the first run did (whatever the pipelining timing)."""
    return seed * 7919 + step


def step_metrics(groups: list[Group], stats: SampleStats, engine_version: int) -> dict[str, Any]:
    episodes = [s for g in groups for s in g.states]
    valid = [s for s in episodes if s.trainable]
    rewards = [s.reward for s in valid if s.reward is not None]
    mean = sum(rewards) / len(rewards) if rewards else None
    versions = [t.weight_version for s in valid for t in s.turns if t.weight_version is not None]
    row: dict[str, Any] = {
        "reward/mean": mean,
        "reward/std": (sum((r - mean) ** 2 for r in rewards) / len(rewards)) ** 0.5
        if mean is not None
        else None,
        "episodes/total": len(episodes),
        "episodes/masked": len(episodes) - len(valid),
        "episodes/masked_fraction": (len(episodes) - len(valid)) / len(episodes) if episodes else 0.0,
        "groups/zero_variance": sum(1 for g in groups if g.skip_reason == "zero_variance"),
        "groups/too_few_valid": sum(1 for g in groups if g.skip_reason == "too_few_valid"),
        "tokens/completion_mean": sum(len(t.completion_ids) for s in valid for t in s.turns)
        / max(1, len(valid)),
        "samples/trained": stats.samples,
        "samples/breaks": stats.breaks,
        "off_policy/max_staleness": engine_version - min(versions) if versions else 0,
        "drift/tokens": sum(e.drift_tokens or 0 for e in episodes),
    }
    for reason, count in Counter(e.stop_reason for e in episodes).items():
        row[f"stop/{reason}"] = count
    return row
