"""Verdicts on training curves (``bridges.compare runs=[...]``): did each run learn, and is one run's end
better, worse or the same as another's?

A run's level is the mean reward of its last ``k`` logged steps; its interval comes from resampling those
step means (a bootstrap over steps: each step's mean is already an average over its groups). "Learned"
compares the last ``k`` steps with the first ``k``; a pair compares the two runs' last ``k`` steps,
resampled independently (the runs' steps are not paired draws). An interval that holds 0 is "same" (or
"did not learn"): with few steps or noisy rewards that is the honest answer, and several seeds as several
runs narrow it.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Difference:
    """A mean difference with its 95% bootstrap interval."""

    value: float
    lo: float
    hi: float

    def verdict(self, above: str, below: str, neither: str) -> str:
        if math.isnan(self.lo):
            return "n/a"
        return above if self.lo > 0 else below if self.hi < 0 else neither

    def __str__(self) -> str:
        if math.isnan(self.lo):
            return f"{self.value:+.4f} [no interval]"
        return f"{self.value:+.4f} [{self.lo:+.4f}, {self.hi:+.4f}]"


def window(rewards: list[float], k: int) -> int:
    """The steps each end of a run is judged on: ``k``, or half the run when it is shorter than 2k."""
    return max(1, min(k, len(rewards) // 2))


def bootstrap_difference(a: list[float], b: list[float], iterations: int, seed: int) -> Difference:
    """mean(a) - mean(b), with a and b resampled independently. One value on a side has no spread to
    resample: its interval would be a point, and any change would read as a verdict, so there is none."""
    if not a or not b:
        return Difference(math.nan, math.nan, math.nan)
    if min(len(a), len(b)) < 2:
        return Difference(sum(a) / len(a) - sum(b) / len(b), math.nan, math.nan)
    rng = random.Random(seed)
    draws = sorted(
        sum(rng.choice(a) for _ in a) / len(a) - sum(rng.choice(b) for _ in b) / len(b) for _ in range(iterations)
    )
    value = sum(a) / len(a) - sum(b) / len(b)
    return Difference(value, draws[int(0.025 * (iterations - 1))], draws[int(0.975 * (iterations - 1))])


def learned(rewards: list[float], k: int, iterations: int = 2000, seed: int = 0) -> Difference:
    """The last ``k`` steps' mean reward less the first ``k`` steps'."""
    if len(rewards) < 2:
        return Difference(math.nan, math.nan, math.nan)
    n = window(rewards, k)
    return bootstrap_difference(rewards[-n:], rewards[:n], iterations, seed)


def curve_rows(curves: dict[str, list[float]], k: int, iterations: int, seed: int) -> list[list[str]]:
    """One row per run: its ends, how much it moved, and whether it learned."""
    rows = [["run", "steps", f"first {k} steps", f"last {k} steps", "last - first (95% CI)", "learned?"]]
    for name, rewards in curves.items():
        n, moved = window(rewards, k), learned(rewards, k, iterations, seed)
        rows.append([name, str(len(rewards)), f"{sum(rewards[:n]) / n:.4f}", f"{sum(rewards[-n:]) / n:.4f}",
                     str(moved), moved.verdict("learned", "got worse", "did not learn")])
    return rows


def pair_rows(curves: dict[str, list[float]], k: int, iterations: int, seed: int) -> list[list[str]]:
    """One row per pair of runs: the difference of their last ``k`` steps, and the verdict on it."""
    rows = [["run a", "run b", f"last {k} steps, a - b (95% CI)", "verdict"]]
    names = list(curves)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            ends = [curves[name][-window(curves[name], k) :] for name in (a, b)]
            gap = bootstrap_difference(ends[0], ends[1], iterations, seed)
            rows.append([a, b, str(gap), gap.verdict(f"{a} better", f"{a} worse", "same")])
    return rows
