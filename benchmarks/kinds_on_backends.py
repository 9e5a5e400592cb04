"""Every kind of environment trained on every backend by one command: one curve per cell, with a verdict.

Kinds (all download-free, all the embedded default task's letters, so one tiny model learns each on a
CPU): ``single`` (``repeat_letter``), ``turns`` (``repeat_letter_turns``: feedback between turns),
``tool`` (``repeat_letter_tool``: a tool call needed for full reward), ``agent``
(``repeat_letter_agent``: an OpenAI SDK program over a session) and ``v1`` (``repeat_letter_taskset``:
a verifiers v1 taskset). Each cell is ``python -m bridges.train backend=<b> env=<env> seed=<s>`` with the
same batch, group, sampling and steps everywhere (Tinker against its local server), timed end to end.

Per cell it prints one ``key=value`` line; per kind, whether each backend learned (its last ``k`` steps
against its first) and how each backend's end compares with grpo's: 95% bootstrap intervals over steps
with one seed, over seeds with several.
``--figure`` draws one panel per kind. A cell a backend cannot run ends in the run's own sentence.
``--report-only`` gives the verdicts and figure of the runs already in ``--output-dir`` (cells trained
by several invocations, one backend at a time), each judged on its first ``--steps`` steps, so a cell
trained for fewer steps is set against the others at the same step (the learning rate is constant
after warm-up, so a longer run's first steps are a shorter run).

    python benchmarks/kinds_on_backends.py --steps 250 --seeds 0 1 2 --figure docs/kinds_on_backends.png
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bridges.jobs.curve_verdict import bootstrap_difference, window

KINDS = {"single": "repeat_letter", "turns": "repeat_letter_turns", "tool": "repeat_letter_tool",
         "agent": "repeat_letter_agent", "v1": "repeat_letter_taskset"}
BACKENDS = ("grpo", "trl", "tinker", "verl")
TIMES = "kinds_times.jsonl"  # each finished run's wall time, one JSON line a run


@dataclass
class Cell:
    """One kind on one backend: a reward curve per seed, each run's wall seconds per step, or why none ran."""

    kind: str
    backend: str
    curves: list[list[float]] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)
    failure: str | None = None


def run_name(cell: Cell, seed: int) -> str:
    return f"kinds-{cell.kind}-{cell.backend}-s{seed}"


def train(args: argparse.Namespace, extra: list[str], cell: Cell, seed: int) -> None:
    name = run_name(cell, seed)
    command = [sys.executable, "-m", "bridges.train", f"backend={cell.backend}", f"env={KINDS[cell.kind]}",
               f"seed={seed}", f"trainer.max_steps={args.steps}", f"trainer.batch_size={args.batch_size}",
               f"trainer.group_size={args.group_size}", f"output_dir={args.output_dir}", f"run_name={name}",
               "overwrite=true", "progress=false", *extra]
    if cell.backend == "tinker":
        command.append("tinker.base_url=local")
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        said = [line for line in done.stderr.splitlines() if line.strip()]
        cell.failure = said[-1] if said else f"bridges.train exited with {done.returncode}"
        return
    with open(Path(args.output_dir) / TIMES, "a") as times:  # --report-only reads the cells back from here
        times.write(json.dumps({"run": name, "seconds": seconds}) + "\n")
    if not collect(args, cell, seed, seconds):
        cell.failure = f"{name} exited 0 with no step in its metrics.jsonl"


def collect(args: argparse.Namespace, cell: Cell, seed: int, seconds: float) -> bool:
    """A finished run's reward curve (a step with no valid rollout counts 0) and its wall time per step
    (start-up included: it is part of what a user waits for); False when its folder holds no step."""
    path = Path(args.output_dir) / run_name(cell, seed) / "metrics.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    if not rows:
        return False
    curve = [r["reward/mean"] if r.get("reward/mean") is not None else 0.0 for r in rows]
    cell.curves.append(curve[: args.steps])  # a longer run is judged on its first --steps steps
    cell.step_seconds.append(seconds / len(curve))
    return True


def recorded(args: argparse.Namespace, cell: Cell) -> None:
    """``--report-only``: the cell's runs already in ``--output-dir`` (the newest time of each), none trained."""
    path = Path(args.output_dir) / TIMES
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    times = {line["run"]: float(line["seconds"]) for line in lines}
    for seed in args.seeds:
        if (name := run_name(cell, seed)) in times:
            collect(args, cell, seed, times[name])
    if not cell.curves:
        cell.failure = f"no finished run in {args.output_dir}"


def ends(curves: list[list[float]], k: int, last: bool) -> list[float]:
    """What the bootstrap resamples at one end of a cell's curves: with one seed its first (or last) ``k``
    step means; with several, each seed's mean over those steps, so the interval is over seeds (a seed
    that learned late is one draw of three, not ``k`` steps that all agree with each other)."""
    pieces = [c[-window(c, k):] if last else c[: window(c, k)] for c in curves]
    return pieces[0] if len(pieces) == 1 else [sum(p) / len(p) for p in pieces]


def figure_line(cell: Cell, k: int) -> str:
    if cell.failure is not None:
        return f"kind={cell.kind} backend={cell.backend} ran=false reason={cell.failure!r}"
    first, last = ends(cell.curves, k, False), ends(cell.curves, k, True)
    moved = bootstrap_difference(last, first, 2000, 0)
    per_step = sorted(cell.step_seconds)
    return (f"kind={cell.kind} backend={cell.backend} seeds={len(cell.curves)} steps={len(cell.curves[0])} "
            f"step_seconds_median={per_step[len(per_step) // 2]:.2f} step_seconds_min={per_step[0]:.2f} "
            f"step_seconds_max={per_step[-1]:.2f} first={sum(first) / len(first):.3f} last={sum(last) / len(last):.3f} "
            f"learned={moved.verdict('yes', 'worse', 'no')} moved={moved.value:+.3f}")


def against(cell: Cell, base: Cell | None, k: int) -> str:
    """The cell's last ``k`` steps less grpo's on the same kind, with the verdict on the difference."""
    if base is None or base is cell:
        return "-"
    gap = bootstrap_difference(ends(cell.curves, k, True), ends(base.curves, k, True), 2000, 0)
    return f"{gap} {gap.verdict('better', 'worse', 'same')}"


def verdict_rows(cells: list[Cell], k: int) -> list[str]:
    """Markdown rows: each cell's ends, whether it learned, and its end against grpo's on the same kind."""
    rows = ["| kind | backend | seeds | s/step (median) | first k -> last k | learned? | last k vs grpo (95% CI) |",
            "|---|---|---|---|---|---|---|"]
    grpo = {c.kind: c for c in cells if c.backend == "grpo" and c.failure is None}
    for cell in cells:
        if cell.failure is not None:
            rows.append(f"| {cell.kind} | {cell.backend} | - | - | - | not run: {cell.failure} | - |")
            continue
        first, last = ends(cell.curves, k, False), ends(cell.curves, k, True)
        moved = bootstrap_difference(last, first, 2000, 0)
        per_step = sorted(cell.step_seconds)[len(cell.step_seconds) // 2]
        rows.append(f"| {cell.kind} | {cell.backend} | {len(cell.curves)} | {per_step:.1f} | "
                    f"{sum(first) / len(first):.3f} -> {sum(last) / len(last):.3f} | "
                    f"{moved.verdict('learned', 'got worse', 'did not learn')} | {against(cell, grpo.get(cell.kind), k)} |")
    return rows


def draw(cells: list[Cell], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(dict.fromkeys(c.kind for c in cells))
    fig, axes = plt.subplots(1, len(kinds), figsize=(3.2 * len(kinds), 3.0), sharey=True, squeeze=False)
    for ax, kind in zip(axes[0], kinds, strict=True):
        for cell in (c for c in cells if c.kind == kind and c.failure is None):
            steps = min(len(c) for c in cell.curves)
            mean = [sum(c[i] for c in cell.curves) / len(cell.curves) for i in range(steps)]
            ax.plot(range(1, steps + 1), mean, label=cell.backend, linewidth=1.2)
        ax.set_title(f"{kind} ({KINDS[kind]})", fontsize=8)
        ax.set_xlabel("step", fontsize=8)
    axes[0][0].set_ylabel("mean reward", fontsize=8)
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def positive(text: str) -> int:
    """A count of at least 1 (argparse turns the ValueError into its one-line usage error, exit 2)."""
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS))
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=list(BACKENDS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--steps", type=positive, default=250)
    parser.add_argument("--batch-size", type=positive, default=16)
    parser.add_argument("--group-size", type=positive, default=16)
    parser.add_argument("--last-k", type=positive, default=10, help="steps each end of a curve is judged on")
    parser.add_argument("--output-dir", default="runs")
    parser.add_argument("--figure", type=Path, default=None)
    parser.add_argument("--report-only", action="store_true", help="the verdicts of runs already in --output-dir")
    args, extra = parser.parse_known_args()
    cells = [Cell(kind, backend) for kind in args.kinds for backend in args.backends]
    for cell in cells:
        if args.report_only:
            recorded(args, cell)
        for seed in args.seeds if not args.report_only else []:
            if cell.failure is None:
                train(args, extra, cell, seed)
        print(figure_line(cell, args.last_k), flush=True)
    print("\n".join(verdict_rows(cells, args.last_k)))
    if args.figure is not None:
        draw(cells, args.figure)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
