"""The statistics and the report of ``python -m bridges.compare``: one module, no engine code.

Rollouts of different backends are paired (same rows, same seeds, same order), so a difference is
judged on per-rollout differences: a paired bootstrap of their mean, and the verdict "same" when the
95% interval contains 0. Errored rollouts (reward None) drop out of every pair they are in.
"""

from __future__ import annotations

import html
import math
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bridges.runs.metrics import saved_figure

FIGURE_SIZE = (6.4, 3.6)


@dataclass
class BackendResult:
    name: str
    engine: str
    rewards: list[float | None]
    stop_reasons: list[str]
    drift_tokens: list[int]
    completion_tokens: int
    seconds: float
    rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def valid(self) -> list[float]:
        return [r for r in self.rewards if r is not None]

    def completions(self) -> list[tuple[tuple[int, ...], ...]]:
        """Each rollout's sampled token ids, turn by turn (paired by position across backends)."""
        return [tuple(tuple(t.get("completion_ids") or ()) for t in row.get("turns") or ()) for row in self.rows]


def caveats(results: list[BackendResult]) -> list[str]:
    """What makes the verdicts say less than they seem to: rewards all zero (every verdict is 'same' by
    construction) or completions identical across backends (the same engine and seeds sampled the same
    tokens: the verdicts check each backend's rendering and scoring, not its sampling)."""
    said = []
    valid = [v for r in results for v in r.valid]
    if valid and all(v == 0.0 for v in valid):
        said.append("nothing to compare: every rollout of every backend earned reward 0, so every verdict is "
                    "'same' by construction; compare a model that partly solves the task (a trained run's "
                    "checkpoint, see docs/guide/compare.md).")
    sampled = [r.completions() for r in results]
    if len(results) > 1 and sampled[0] and all(s == sampled[0] for s in sampled[1:]):
        said.append("every backend sampled the same completions token for token (one set of weights, the same "
                    "seeds): the verdicts check each backend's rendering, tokens and scoring, not its sampling.")
    return said


def mean_ci(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its normal-approximation 95% interval."""
    if not values:
        return math.nan, math.nan
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, math.nan
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return mean, 1.96 * math.sqrt(var / len(values))


def paired_bootstrap(
    a: list[float | None], b: list[float | None], iterations: int = 2000, seed: int = 0
) -> tuple[float, float, float, int]:
    """(mean difference a-b, 2.5% and 97.5% bootstrap quantiles, pairs used)."""
    diffs = [x - y for x, y in zip(a, b, strict=True) if x is not None and y is not None]
    if not diffs:
        return math.nan, math.nan, math.nan, 0
    rng = random.Random(seed)
    n = len(diffs)
    means = sorted(sum(diffs[rng.randrange(n)] for _ in range(n)) / n for _ in range(iterations))
    lo, hi = means[int(0.025 * (iterations - 1))], means[int(0.975 * (iterations - 1))]
    return sum(diffs) / n, lo, hi, n


def verdict(lo: float, hi: float) -> str:
    if math.isnan(lo) or math.isnan(hi):
        return "n/a"
    return "same" if lo <= 0.0 <= hi else "differ"


def comparisons(results: list[BackendResult], iterations: int, seed: int) -> list[dict[str, Any]]:
    out = []
    for i, a in enumerate(results):
        for b in results[i + 1 :]:
            diff, lo, hi, n = paired_bootstrap(a.rewards, b.rewards, iterations, seed)
            out.append(
                {
                    "a": a.name,
                    "b": b.name,
                    "diff": diff,
                    "lo": lo,
                    "hi": hi,
                    "pairs": n,
                    "verdict": verdict(lo, hi),
                }
            )
    return out


def plot_distributions(results: list[BackendResult], path: Path, title: str) -> Path:
    data = [r.valid or [math.nan] for r in results]
    with saved_figure(path, FIGURE_SIZE) as ax:
        ax.boxplot(data, showmeans=True)
        ax.set_xticks(range(1, len(results) + 1), [r.name for r in results])
        for i, values in enumerate(data, 1):
            jitter = random.Random(i)
            ax.scatter([i + jitter.uniform(-0.12, 0.12) for _ in values], values, s=8, alpha=0.4)
        ax.set_ylabel("reward per rollout")
        ax.set_title(title)
        ax.grid(alpha=0.3, axis="y")
    return path


def plot_curves(runs: dict[str, list[tuple[int, float]]], path: Path, axis: str = "step") -> Path:
    with saved_figure(path, FIGURE_SIZE) as ax:
        for name, points in runs.items():
            xs, rewards = zip(*points, strict=True) if points else ((), ())
            ax.plot(xs, rewards, label=name)
        ax.set_xlabel(axis)
        ax.set_ylabel("mean reward")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
    return path


def _fmt(x: float, digits: int = 4) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def tables(results: list[BackendResult], pairs: list[dict[str, Any]]) -> dict[str, list[list[str]]]:
    per_backend = [
        # no tokens/s: a one-off evaluation of a few rows times start-up and warm-up, not the engine
        ["backend", "engine", "rollouts", "reward mean ± 95% CI", "errored", "drift tokens"]
    ]
    for r in results:
        mean, half = mean_ci(r.valid)
        per_backend.append(
            [r.name, r.engine, str(len(r.rewards)), f"{_fmt(mean)} ± {_fmt(half)}", str(len(r.rewards) - len(r.valid)),
             str(sum(r.drift_tokens))]
        )
    reasons = sorted({s for r in results for s in r.stop_reasons})
    stops = [["backend", *reasons]]
    for r in results:
        counts = Counter(r.stop_reasons)
        stops.append([r.name, *(str(counts.get(reason, 0)) for reason in reasons)])
    diffs = [["pair", "mean difference", "95% bootstrap CI", "pairs", "verdict"]]
    for p in pairs:
        diffs.append(
            [
                f"{p['a']} − {p['b']}",
                _fmt(p["diff"]),
                f"[{_fmt(p['lo'])}, {_fmt(p['hi'])}]",
                str(p["pairs"]),
                p["verdict"],
            ]
        )
    return {"Reward per backend": per_backend, "Pairwise differences": diffs, "Stop reasons": stops}


def write_reports(
    output: Path, title: str, header: list[str], sections: dict[str, list[list[str]]], images: list[str]
) -> tuple[Path, Path]:
    """``report.md`` and ``report.html`` with the same tables and pictures."""
    md = [f"# {title}", "", *header, ""]
    for name, table in sections.items():
        md += [f"## {name}", "", "| " + " | ".join(table[0]) + " |", "|" + "---|" * len(table[0])]
        md += ["| " + " | ".join(row) + " |" for row in table[1:]]
        md.append("")
    md += [f"![{image}]({image})" for image in images]
    (output / "report.md").write_text("\n".join(md) + "\n")
    body = [f"<h1>{html.escape(title)}</h1>", *(f"<p>{html.escape(line)}</p>" for line in header)]
    for name, table in sections.items():
        cells = "".join("<th>" + html.escape(c) + "</th>" for c in table[0])
        rows = "".join(
            "<tr>" + "".join("<td>" + html.escape(c) + "</td>" for c in row) + "</tr>" for row in table[1:]
        )
        body.append(f"<h2>{html.escape(name)}</h2><table><tr>{cells}</tr>{rows}</table>")
    body += [f'<img src="{html.escape(image)}" alt="{html.escape(image)}">' for image in images]
    style = "body{font-family:sans-serif;max-width:60em;margin:2em auto}td,th{border:1px solid #ccc;padding:.3em .6em}table{border-collapse:collapse}"
    page = f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>{style}</style></head><body>{''.join(body)}</body></html>"
    (output / "report.html").write_text(page)
    return output / "report.md", output / "report.html"
