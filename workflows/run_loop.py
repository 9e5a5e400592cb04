"""The training loop every backend that drives its own steps shares (the bundled grpo trainer, Tinker).

A backend supplies a ``Learner``: how to start one batch's rollouts on the current weights, how to
train on a batch's samples (and hand the new weights to its sampler), how to save. Everything a user
compares across backends lives here once, so it cannot drift between them:
- the data order and seed schedule (``rows_at`` by data position, ``batch_seed`` by step), so a
  resumed run samples step k exactly as the first run did;
- the pipeline: batches for the next ``num_batches_ahead`` steps are already generating while a step
  trains (each tagged with its step, so neither seeds nor rows depend on timing);
- which samples train (``groups_to_samples``), the step's metric row, ``timing/*``, traces,
  ``metrics.jsonl``, the progress line, the save cadence and the end-of-run report;
- the non-finite guard: a backend reports ``skipped_nonfinite`` and ``MAX_NONFINITE_STEPS`` of them
  in a row stop the run in one sentence (something upstream is broken; more steps would not help).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from bridges.runs.metrics import StepProgress, finish_run
from bridges.runtime.errors import TrainingDivergedError
from bridges.workflows.batches import batch_seed, groups_to_samples, rows_at, step_metrics, step_tallies
from bridges.workflows.traces import open_run_files
from bridges.workflows.types import Group, TrainingSample

MAX_NONFINITE_STEPS = 3  # skipped non-finite steps in a row before the run stops


@dataclasses.dataclass(frozen=True)
class RunPosition:
    """Where a run is: steps done and dataset rows consumed (all a checkpoint needs to resume the data)."""

    step: int = 0
    data_position: int = 0


class Learner(Protocol):
    """What a backend gives the loop."""

    @property
    def weight_version(self) -> int:
        """The version of the weights new batches sample from (one more per applied step)."""
        ...

    def start_batch(
        self, rows: list[dict[str, Any]], sampling_args: dict[str, Any]
    ) -> Awaitable[list[Group]]:
        """Start the rollouts of one batch on the current weights; the loop awaits them later."""
        ...

    async def train(self, samples: list[TrainingSample]) -> dict[str, Any]:
        """One optimizer step (none when ``samples`` is empty), then the new weights to the sampler.
        Returns the step's metrics under the shared names (``loss``, ``grad_norm``, ``lr``,
        ``skipped_nonfinite``, ...)."""
        ...

    async def save(self, position: RunPosition) -> None:
        """A checkpoint a later ``resume=true`` starts from at ``position``."""
        ...


@dataclasses.dataclass(frozen=True)
class Reducer:
    """How the loop sees the training processes (one process: itself). Each process runs its share of
    every batch and writes its own episodes; ``combine`` adds the processes' step tallies up, and the
    main process alone writes ``metrics.jsonl``, shows progress and ends the run's report."""

    is_main: bool = True
    combine: Callable[[dict[str, float]], dict[str, float]] = lambda tallies: tallies
    barrier: Callable[[], None] = lambda: None


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """What the loop writes and how it is labelled (provenance of every trace line)."""

    run_dir: Path
    backend: str
    engine: str
    model: str
    dataset: Any
    sampling_args: dict[str, Any]
    artifacts: list[str]  # the files the end-of-run line names, besides the reward curve
    reducer: Reducer = Reducer()
    rows_together: int = 1  # Environment.rows_together: blocks of rows the data order keeps adjacent


async def run_training(
    config: Any, spec: RunSpec, learner: Learner, start: RunPosition
) -> list[dict[str, Any]]:
    """Train from ``start`` to ``trainer.max_steps``; returns the metric rows of this process's steps."""
    t, reducer = config.trainer, spec.reducer
    files = functools.partial(open_run_files, config, spec.run_dir, spec.backend, spec.engine, spec.model,
                              spec.sampling_args, start.step)  # fmt: skip
    opened = files() if reducer.is_main else None
    await asyncio.to_thread(reducer.barrier)  # [distributed] the others append once the files are cut back
    logger, traces = opened or files(main=False)
    progress = StepProgress(config.progress, t.max_steps, start.step, spec.backend, shown=reducer.is_main)
    pending: deque[Awaitable[list[Group]]] = deque()
    position, ahead, streak = start, start, 0
    started = time.perf_counter()
    try:
        while position.step < t.max_steps:
            while ahead.step < t.max_steps and len(pending) <= t.num_batches_ahead:
                rows = rows_at(spec.dataset, ahead.data_position, t.batch_size, config.seed, spec.rows_together)
                args = {**spec.sampling_args, "seed": batch_seed(config.seed, ahead.step)}
                pending.append(learner.start_batch(rows, args))
                ahead = RunPosition(ahead.step + 1, ahead.data_position + t.batch_size)
            waiting = time.perf_counter()
            groups = await pending.popleft()
            waited = time.perf_counter() - waiting
            for group in groups:
                traces.write_group(group, step=position.step + 1)
            samples, stats = groups_to_samples(groups, t.max_completion_length)
            training = time.perf_counter()
            result = await learner.train(samples)
            streak = streak + 1 if result.get("skipped_nonfinite") else 0
            if streak >= MAX_NONFINITE_STEPS:
                raise _diverged(position.step + 1, streak, result)
            position = RunPosition(position.step + 1, position.data_position + t.batch_size)
            tallies = reducer.combine(step_tallies(groups, stats, learner.weight_version))
            row = {"step": position.step, **step_metrics(tallies), **result,
                   "timing/train_s": time.perf_counter() - training, "timing/wait_generation_s": waited,
                   "timing/elapsed_s": time.perf_counter() - started, "weight_version": learner.weight_version}  # fmt: skip
            if logger is not None:
                logger.log(row)
            progress.report(row)
            if (
                config.save_every > 0 and position.step % config.save_every == 0
            ) or position.step == t.max_steps:
                await learner.save(position)
    finally:
        await _cancel(pending)
        traces.close()
        if logger is not None:
            logger.close()
        progress.close()
    if logger is None:
        return []
    finish_run(logger.rows, spec.run_dir, f"{config.env} · {spec.model} · {spec.backend}", spec.artifacts)
    return logger.rows


def _diverged(step: int, streak: int, result: dict[str, Any]) -> TrainingDivergedError:
    return TrainingDivergedError(
        f"training stopped at step {step}: {streak} steps in a row had a non-finite loss or gradient norm "
        f"(last loss {result.get('loss')}, grad_norm {result.get('grad_norm')}), so none was applied; lower "
        "trainer.learning_rate or check the environment's rewards. The weights are those of the last "
        "finite step."
    )


async def _cancel(pending: deque[Awaitable[list[Group]]]) -> None:
    """Batches generated ahead of a run that stops are cancelled and awaited (nothing left running)."""
    futures = [asyncio.ensure_future(p) for p in pending]
    for future in futures:
        future.cancel()
    await asyncio.gather(*futures, return_exceptions=True)
