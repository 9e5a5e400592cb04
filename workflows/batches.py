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

from bridges.workflows.samples import SampleStats, count_breaks, state_to_samples, truncate_sample
from bridges.workflows.types import Group, TrainingSample


@functools.lru_cache(maxsize=4)
def _epoch_order(size: int, seed: int, epoch: int, together: int = 1) -> tuple[int, ...]:
    """A seeded permutation of the rows; blocks of ``together`` consecutive rows move whole (a dataset
    whose size is not a multiple of it is shuffled row by row). With 1 it is a plain row shuffle."""
    together = together if together > 1 and size % together == 0 else 1
    blocks = list(range(size // together))
    random.Random(seed * 1_000_003 + epoch).shuffle(blocks)
    return tuple(block * together + i for block in blocks for i in range(together))


def rows_at(dataset: Any, position: int, count: int, seed: int, together: int = 1) -> list[dict[str, Any]]:
    size = len(dataset)
    rows = []
    for pos in range(position, position + count):
        epoch, offset = divmod(pos, size)
        rows.append(dataset[_epoch_order(size, seed, epoch, together)[offset]])
    return rows


def groups_to_samples(
    groups: list[Group], max_completion_length: int, first_segment_only: bool = False
) -> tuple[list[TrainingSample], SampleStats]:
    """Samples of the groups that carry signal; masked and no-signal members cost no compute.
    ``first_segment_only`` (``trainer.ledger_breaks=first``): of an episode whose ledger broke, the first
    sequence alone, as TRL and verl train it; the break is counted either way."""
    stats = SampleStats()
    samples: list[TrainingSample] = []
    for group in groups:
        if not group.contributes_gradient:
            continue
        for state, advantage in zip(group.states, group.advantages, strict=True):
            if state.trainable and advantage != 0.0:
                found = state_to_samples(state, advantage)
                kept = found[:1] if first_segment_only else found
                stats.samples, stats.breaks = stats.samples + len(kept), stats.breaks + len(found) - 1
                samples.extend(truncate_sample(s, s.prompt_length + max_completion_length) for s in kept)
    return samples, stats


def batch_seed(seed: int, step: int) -> int:
    """The sampling seed of one step's batch: a function of the run's seed and the step alone, so a
    resumed run samples step k exactly as the first run did (whatever the pipelining timing)."""
    return seed * 7919 + step


def step_tallies(
    groups: list[Group], stats: SampleStats, engine_version: int, reward_names: tuple[str, ...] = ()
) -> dict[str, float]:
    """One process's share of a step as sums (``max/`` keys: maxima), so several processes' shares add up
    exactly (``step_metrics`` turns the total into the step's row). ``reward_names``: the rubric's
    functions, each tallied from the valid episodes' own scores (``fn/<name>/…``), so a run shows which
    function moved, not only their weighted total."""
    episodes = [s for g in groups for s in g.states]
    valid = [s for s in episodes if s.trainable]
    rewards = [float(s.reward) for s in valid if s.reward is not None]
    versions = [t.weight_version for s in valid for t in s.turns if t.weight_version is not None]
    tallies: dict[str, float] = {
        "episodes": len(episodes), "valid": len(valid), "rewards": len(rewards), "reward_sum": sum(rewards),
        "reward_sq_sum": sum(r * r for r in rewards),
        "zero_variance": sum(1 for g in groups if g.skip_reason == "zero_variance"),
        "too_few_valid": sum(1 for g in groups if g.skip_reason == "too_few_valid"),
        "completion_tokens": sum(len(t.completion_ids) for s in valid for t in s.turns),
        # breaks over every rollout of the step, trained or not, as TRL and verl count them
        "samples": stats.samples, "breaks": sum(count_breaks((t.prompt_ids, t.completion_ids) for t in e.turns)
                                                for e in episodes),
        "drift_tokens": sum(e.drift_tokens or 0 for e in episodes),
        "max/staleness": engine_version - min(versions) if versions else 0,
    }
    for reason, count in Counter(e.stop_reason for e in episodes).items():
        tallies[f"stop/{reason}"] = count
    for name in reward_names:
        scores = [float(s.metrics[name]) for s in valid if isinstance(s.metrics.get(name), (int, float))]
        tallies.update({f"fn/{name}/n": len(scores), f"fn/{name}/sum": sum(scores),
                        f"fn/{name}/sq_sum": sum(x * x for x in scores)})
    return tallies


def _moments(count: float, total: float, squares: float) -> tuple[float | None, float | None]:
    """Mean and (population) standard deviation from a count, a sum and a sum of squares."""
    if not count:
        return None, None
    mean = total / count
    return mean, max(0.0, squares / count - mean * mean) ** 0.5


def step_metrics(tallies: dict[str, float]) -> dict[str, Any]:
    """The step's metric row from its (summed) tallies."""
    episodes = int(tallies["episodes"])
    mean, std = _moments(tallies["rewards"], tallies["reward_sum"], tallies["reward_sq_sum"])
    masked = episodes - int(tallies["valid"])
    row: dict[str, Any] = {
        "reward/mean": mean,
        "reward/std": std,
        "episodes/total": episodes,
        "episodes/masked": masked,
        "episodes/masked_fraction": masked / episodes if episodes else 0.0,
        "groups/zero_variance": int(tallies["zero_variance"]),
        "groups/too_few_valid": int(tallies["too_few_valid"]),
        "tokens/completion_mean": tallies["completion_tokens"] / max(1, tallies["valid"]),
        "samples/trained": int(tallies["samples"]),
        "samples/breaks": int(tallies["breaks"]),
        "off_policy/max_staleness": int(tallies["max/staleness"]),
        "drift/tokens": int(tallies["drift_tokens"]),
    }
    row.update({key: int(value) for key, value in tallies.items() if key.startswith("stop/")})
    for key in [k for k in tallies if k.startswith("fn/") and k.endswith("/n")]:
        name = key[len("fn/"):-len("/n")]
        fn_mean, fn_std = _moments(tallies[key], tallies[f"fn/{name}/sum"], tallies[f"fn/{name}/sq_sum"])
        row.update({f"reward/{name}/mean": fn_mean, f"reward/{name}/std": fn_std})
    return row
