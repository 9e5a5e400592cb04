"""Where a training run reports, whatever its backend: ``metrics.jsonl`` (always), the console, wandb, a PNG curve.

``metrics.jsonl`` is the source of truth; everything else is a view of it. On resume the lines
of steps after the checkpoint are dropped, so a resumed run's file reads like one straight run.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from bridges.runs.reward_parts import progress_text, summary_lines
from bridges.runtime.errors import ConfigError, NothingTrainedError, RewardFunctionError, require_extra

# The names every backend writes to metrics.jsonl, whatever its native trainer calls them (the guide's
# docs/guide/metrics.md says what each means per backend); a backend with other native names maps them with
# ``renamed`` before logging, so curves and reports compare across backends without a lookup table.
SHARED_METRICS = (
    "reward/mean", "reward/std", "loss", "grad_norm", "lr", "episodes/masked_fraction",
    "tokens/completion_mean", "timing/step_s",
)


def renamed(row: Mapping[str, Any], names: Mapping[str, str]) -> dict[str, Any]:
    """``row`` with a backend's native metric names replaced by the shared ones."""
    return {names.get(key, key): value for key, value in row.items()}


def read_metric_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl`` (none when the file does not exist yet)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class MetricsLogger:
    def __init__(
        self, run_dir: Path, config: dict[str, Any], report_to: str = "none", resume_step: int = 0,
        wandb_project: str = "rl-bridges", wandb_entity: str | None = None,
    ):
        if report_to not in ("none", "wandb"):
            raise ConfigError(f"report_to must be 'none' or 'wandb', got '{report_to}'.")
        self.path = run_dir / "metrics.jsonl"
        self.rows: list[dict[str, Any]] = []
        self.rows = [r for r in read_metric_rows(self.path) if r.get("step", 0) <= resume_step]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("".join(json.dumps(r) + "\n" for r in self.rows))
        self._file = self.path.open("a")
        self._last_log = time.perf_counter()
        self._wandb = None
        if report_to == "wandb":
            wandb = require_extra("wandb", "wandb", "report_to=wandb")
            if not os.environ.get("WANDB_API_KEY") and "WANDB_MODE" not in os.environ:
                os.environ["WANDB_MODE"] = "offline"  # no key, no network: log locally, sync later
            self._wandb = wandb.init(
                project=wandb_project,
                entity=wandb_entity,
                name=run_dir.name,
                dir=str(run_dir),
                config=config,
                resume="allow",
            )

    def log(self, row: dict[str, Any]) -> None:
        """Append one step's row; ``timing/step_s`` (time since the previous row) is added here, so every
        backend measures it the same way."""
        now = time.perf_counter()
        row = {**row, "timing/step_s": now - self._last_log}
        self._last_log = now
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        self.rows.append(clean)
        self._file.write(json.dumps(clean) + "\n")
        self._file.flush()
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in clean.items() if v is not None}, step=int(row["step"]))

    def close(self) -> None:
        self._file.close()
        if self._wandb is not None:
            self._wandb.finish()


def quiet_library_bars() -> None:
    """Turn off transformers' per-file bars ("Loading weights", "Writing model shards"): a run loads and
    saves models many times, and the console is for the step view and the result. Called by the
    commands as a run starts (it imports transformers, which the run is about to do anyway)."""
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()


class StepProgress:
    """The console view of a run's steps, the same on every backend (the bundled trainer, Tinker, TRL's
    callback, verl's metric file): a tqdm bar whose postfix is the step's reward, loss and masked
    rollouts, or with ``progress=false`` one line per step. Nothing else is printed per step."""

    def __init__(self, enabled: bool, total: int, initial: int, name: str, *, shown: bool = True) -> None:
        self._bar: Any = None
        self.shown = shown  # false: a process that is not the one reporting for a multi-process run
        if enabled and shown:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, initial=initial, desc=name, unit="step", dynamic_ncols=True)

    def report(self, row: Mapping[str, Any]) -> None:
        """Show the step ``row`` (shared metric names) as done."""
        reward, loss = row.get("reward/mean"), row.get("loss", 0.0)
        text = f"reward={reward:.3f}" if isinstance(reward, int | float) else "reward=n/a"
        text += f" loss={loss:.4f}" if isinstance(loss, int | float) else " loss=n/a"
        text += progress_text(row)
        if "episodes/masked" in row:
            text += f" masked={row['episodes/masked']}"
        evaluated = row.get("eval/reward/mean")
        if isinstance(evaluated, int | float):
            text += f" eval_reward={evaluated:.3f}"
        if not self.shown:
            return
        if self._bar is None:
            print(f"step {row['step']}: {text}", flush=True)
            return
        self._bar.set_postfix_str(text, refresh=False)
        self._bar.update(max(0, int(row["step"]) - self._bar.n))

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def finish_run(rows: list[dict[str, Any]], run_dir: Path, title: str, written: list[str],
               failure: str | None = None) -> None:
    """What every backend does when a run ends: the reward curve, then the first-vs-last reward line
    and where the run's files are. ``failure``: the sentence quoting a reward function that failed
    (``bridges.workflows.traces.reward_failure``), which the run then ends on."""
    curve = plot_reward_curve(rows, run_dir / "reward_curve.png", title)
    rewards = [r["reward/mean"] for r in rows if r.get("reward/mean") is not None]
    if rewards:
        head, tail = rewards[:5], rewards[-5:]
        print(
            f"reward: first {len(head)} steps {sum(head) / len(head):.3f} -> last {len(tail)} steps "
            f"{sum(tail) / len(tail):.3f} over {len(rows)} steps"
        )
        for line in summary_lines(rows):
            print(line)
    files = [*written, *(["reward_curve.png"] if curve else [])]
    print(f"run written to {run_dir} ({', '.join(files)})")
    check_something_trained(rows, failure)
    if failure is not None:  # everything is written: the run ends on the bug, as eval does
        raise RewardFunctionError(f"{failure}; fix the reward and train again (resume=true continues).")


def check_something_trained(rows: list[dict[str, Any]], failure: str | None = None) -> None:
    """A run whose every step had nothing to learn from ends in one sentence, not exit 0: with every
    group's rollouts earning the same reward, GRPO's advantages are all zero and the weights never
    move, however many steps run (a newcomer's exact-match reward on a model that never matches)."""
    steps = [r for r in rows if "reward/mean" in r]
    if not steps or not all(_trained_nothing(r) for r in steps):
        return
    if all(r.get("episodes/masked_fraction") == 1.0 for r in steps):
        why = f"the first: {failure}" if failure else (
            "each trace's stop_reason and error in traces.jsonl.gz say why: an environment error, a failed "
            "reward, a timeout")
        raise NothingTrainedError(
            f"nothing was trained in {len(steps)} steps: every rollout was masked ({why}), so there was "
            "nothing to learn from; see docs/guide/troubleshooting.md."
        )
    rewards = [r["reward/mean"] for r in steps if r.get("reward/mean") is not None]
    mean = f"{sum(rewards) / len(rewards):.3f}" if rewards else "n/a"
    raise NothingTrainedError(
        f"nothing was trained in {len(steps)} steps: in every group all rollouts earned the same reward "
        f"(mean {mean}), so none had an advantage to learn from; give the model a reward it can sometimes "
        "earn (partial credit in the rubric), a stronger model (model=<hub id or folder>), or a warm-up with "
        "bridges.sft (docs/guide/from-zero.md)."
    )


def _trained_nothing(row: dict[str, Any]) -> bool:
    """Whether a step's row says no sample carried an advantage: the bundled trainer and Tinker count the
    samples they trained, TRL the groups without reward spread, verl (neither) the step's reward spread."""
    if "samples/trained" in row:
        return row["samples/trained"] == 0
    if row.get("groups/zero_variance_fraction") is not None:
        return bool(row["groups/zero_variance_fraction"] >= 1.0)
    return row.get("reward/std") == 0.0


@contextlib.contextmanager
def saved_figure(path: Path, size: tuple[float, float] = (6, 3.5)) -> Iterator[Any]:
    """Axes to draw on; the figure is laid out, written to ``path`` (PNG, headless) and closed on exit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=size, dpi=110)
    try:
        yield ax
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)


def plot_reward_curve(rows: list[dict[str, Any]], path: Path, title: str) -> Path | None:
    """A PNG of per-step mean reward with a moving average; None when there is nothing to plot."""
    return plot_curve(rows, "reward/mean", "reward", path, title)


def plot_curve(rows: list[dict[str, Any]], key: str, label: str, path: Path, title: str) -> Path | None:
    """A PNG of ``key`` per step with a moving average; None when no row has it."""
    points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
    if not points:
        return None
    steps, values = zip(*points, strict=True)
    window = max(1, len(values) // 10)
    smooth = [
        sum(values[max(0, i - window + 1) : i + 1]) / len(values[max(0, i - window + 1) : i + 1])
        for i in range(len(values))
    ]
    with saved_figure(path) as ax:
        ax.plot(steps, values, alpha=0.35, label=label)
        ax.plot(steps, smooth, linewidth=2, label=f"moving average ({window})")
        ax.set_xlabel("step")
        ax.set_ylabel(label)
        if key == "reward/mean":
            ax.set_ylim(-0.02, 1.02 if max(values) <= 1 else None)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        # below the axes, never over a curve (inside, a low curve ran under it)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False, fontsize="small")
    return path
