"""What a ``backend=verl`` run leaves in its folder, like every other backend: ``metrics.jsonl`` under
the shared names, ``traces.jsonl`` and the reward curve.

verl's trainer runs in its own processes, so the pieces come from two places: our agent loop writes
each rollout's trace line as it finishes (``trace_writer``; its step is the weight version the rollout
sampled from + 1, which is verl's global step; validation rollouts are marked ``split: eval``), and verl's own file logger writes its native metric
rows (``NATIVE_METRICS``). ``fold_metrics`` joins them after the run: the optimisation figures from
verl under our names, the reward figures from the traces with the rule every backend uses (mean and
std over valid rollouts, masked = not trainable). A resumed run first cuts both files back to the
checkpoint it resumes from (``cut_back``), so the steps run again appear once.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from bridges.runs.metrics import read_metric_rows
from bridges.workflows.traces import TRACES_FILE, TraceWriter, read_traces, traces_path

NATIVE_METRICS = "verl/native_metrics.jsonl"
# verl's metric names -> the shared ones (bridges.runs.metrics.SHARED_METRICS); rewards come from the traces
VERL_METRIC_NAMES = {
    "actor/pg_loss": "loss", "actor/grad_norm": "grad_norm", "actor/lr": "lr",
    "response_length/mean": "tokens/completion_mean", "timing_s/step": "timing/step_s",
}
_WRITERS: dict[str, TraceWriter] = {}


def trace_writer(run_dir: str, provenance: dict[str, Any]) -> TraceWriter:
    """One appending writer per run per process (verl builds an agent loop per trajectory)."""
    if run_dir not in _WRITERS:
        _WRITERS[run_dir] = TraceWriter(Path(run_dir) / TRACES_FILE, provenance, tidy=False)  # cut back at launch
    return _WRITERS[run_dir]


def latest_checkpoint_step(checkpoints: Path) -> int:
    """The step verl's ``resume_mode=auto`` continues from (0: none)."""
    marker = checkpoints / "latest_checkpointed_iteration.txt"
    try:
        return int(marker.read_text().strip())
    except (OSError, ValueError):
        return 0


def cut_back(run_dir: Path, resume: bool) -> int:
    """Before a launch: the traces (and, on a fresh start, everything) of steps after the checkpoint
    verl will resume from are dropped. Returns that step."""
    step = latest_checkpoint_step(run_dir / "checkpoints") if resume else 0
    native = run_dir / NATIVE_METRICS
    if resume and native.exists():  # a launch killed before its rows were folded: fold them now
        done = [r.get("step", 0) for r in read_metric_rows(run_dir / "metrics.jsonl")]
        fold_metrics(run_dir, max(done, default=0))
    native.unlink(missing_ok=True)  # verl truncates it on open anyway; folded rows live in metrics.jsonl
    fold_metrics(run_dir, step)  # then drop the rows of the steps verl will run again
    TraceWriter(traces_path(run_dir), {}, resume_step=step).close()
    return step


def _trainable(line: dict[str, Any]) -> bool:
    """``bridges.envs.types.is_trainable`` for a trace line: the one rule every backend applies."""
    from bridges.envs.types import is_trainable

    tokens = any(turn.get("completion_ids") for turn in line.get("turns") or [])
    return is_trainable(line.get("error"), line.get("stop_reason"), line.get("reward"), tokens)


def _breaks(line: dict[str, Any]) -> int:
    from bridges.workflows.samples import count_breaks

    turns = line.get("turns") or []
    return count_breaks((t.get("prompt_ids") or [], t.get("completion_ids") or []) for t in turns)


def _moments(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    mean = sum(values) / len(values)
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


def _reward_rows(run_dir: Path, reward_names: tuple[str, ...] = ()) -> dict[int, dict[str, Any]]:
    """The reward figures of each step's rollouts, and under ``eval/`` those of verl's validations, on
    the row of the step whose weights they sampled (a trace's step is one past those; the validation
    before training, on step 0's weights, has no row). ``traces.jsonl.gz`` is read once for both."""
    by_step: dict[tuple[int, str], list[dict[str, Any]]] = defaultdict(list)
    path = traces_path(run_dir)
    if path.exists():
        for line in read_traces(path):
            provenance = line.get("provenance") or {}
            step = provenance.get("step")
            if isinstance(step, int):
                evaluation = provenance.get("split") == "eval"
                by_step[(step - 1, "eval/") if evaluation else (step, "")].append(line)
    rows: dict[int, dict[str, Any]] = defaultdict(dict)
    for (step, prefix), lines in by_step.items():
        valid = [x for x in lines if _trainable(x)]
        mean, std = _moments([float(x["reward"]) for x in valid])
        masked = len(lines) - len(valid)
        figures = {"reward/mean": mean, "reward/std": std, "episodes/total": len(lines),
                   "episodes/masked": masked, "episodes/masked_fraction": masked / len(lines)}
        if not prefix:  # a broken ledger's segments after the first, which verl's one sequence a rollout left out
            figures["samples/breaks"] = sum(_breaks(x) for x in lines)
        for name in reward_names:  # each function's own score, as every backend reports it
            scores = [float(x["metrics"][name]) for x in valid if isinstance((x.get("metrics") or {}).get(name), int | float)]
            figures[f"reward/{name}/mean"], figures[f"reward/{name}/std"] = _moments(scores)
        rows[step].update({f"{prefix}{k}": v for k, v in figures.items()})
    return rows


def fold_metrics(run_dir: Path, resume_step: int, reward_names: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """``metrics.jsonl``: the rows up to ``resume_step`` kept, then one row per step verl logged in
    this launch (its native names mapped, the reward figures from the traces, each of ``reward_names``
    among them). Returns every row."""
    from bridges.runs.metrics import renamed

    path = run_dir / "metrics.jsonl"
    rows = [r for r in read_metric_rows(path) if r.get("step", 0) <= resume_step]
    rewards = _reward_rows(run_dir, reward_names)
    native = run_dir / NATIVE_METRICS
    for line in native.read_text().splitlines() if native.exists() else []:
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:  # a line cut by a kill: that step is run again on resume
            continue
        step = int(entry.get("step", 0))
        if step > resume_step and isinstance(entry.get("data"), dict):
            data = {k: v for k, v in renamed(entry["data"], VERL_METRIC_NAMES).items() if _plain(v)}
            rows.append({"step": step, **data, **rewards.get(step, {})})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def _plain(value: Any) -> bool:
    return isinstance(value, int | float | str | bool) and not (
        isinstance(value, float) and not math.isfinite(value)
    )
