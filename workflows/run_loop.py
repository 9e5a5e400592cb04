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
  in a row stop the run in one sentence (something upstream is broken; more steps would not help);
- evaluation on the held-out split every ``eval_every`` steps (``evaluate``): the same rollouts on the
  same rows with the same seed each time, so two evaluations differ only by the weights.
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

from bridges.envs.types import StopReason
from bridges.runs.metrics import StepProgress, finish_run
from bridges.runs.train_config import batches_ahead
from bridges.runtime.errors import TrainingDivergedError
from bridges.workflows.batches import batch_seed, groups_to_samples, rows_at, step_metrics, step_tallies
from bridges.workflows.traces import open_run_files, reward_failure
from bridges.workflows.types import Group, TrainingSample

MAX_NONFINITE_STEPS = 3  # skipped non-finite steps in a row before the run stops
EVAL_SEED_STEP = -1  # every evaluation samples with the seed of this (never trained) step
# the step row's keys an evaluation reports, under eval/ (the others describe training)
EVAL_KEYS = ("reward/mean", "reward/std", "episodes/total", "episodes/masked", "episodes/masked_fraction",
             "tokens/completion_mean")


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
    eval_dataset: Any = None  # the held-out rows ``eval_every`` evaluates on
    reward_names: tuple[str, ...] = ()  # the rubric's functions: each gets reward/<name>/mean and std


async def run_training(
    config: Any, spec: RunSpec, learner: Learner, start: RunPosition
) -> list[dict[str, Any]]:
    """Train from ``start`` to ``trainer.max_steps``; returns the metric rows of this process's steps."""
    t, reducer = config.trainer, spec.reducer
    files = functools.partial(open_run_files, config, spec.run_dir, spec.backend, spec.engine, spec.model,
                              spec.sampling_args, start.step)
    opened = files() if reducer.is_main else None
    await asyncio.to_thread(reducer.barrier)  # [distributed] the others append once the files are cut back
    logger, traces = opened or files(main=False)
    progress = StepProgress(config.progress, t.max_steps, start.step, spec.backend, shown=reducer.is_main)
    pending: deque[Awaitable[list[Group]]] = deque()
    position, ahead, streak = start, start, 0
    started = time.perf_counter()
    try:
        while position.step < t.max_steps:
            while ahead.step < t.max_steps and len(pending) <= batches_ahead(config):
                rows = rows_at(spec.dataset, ahead.data_position, t.batch_size, config.seed, spec.rows_together)
                args = {**spec.sampling_args, "seed": batch_seed(config.seed, ahead.step)}
                pending.append(learner.start_batch(rows, args))
                ahead = RunPosition(ahead.step + 1, ahead.data_position + t.batch_size)
            waiting = time.perf_counter()
            groups = await pending.popleft()
            waited = time.perf_counter() - waiting
            traces.write_groups(groups, step=position.step + 1, split="train")  # one compressed member a step
            samples, stats = groups_to_samples(groups, t.max_completion_length, t.ledger_breaks == "first")
            training = time.perf_counter()
            result = await learner.train(samples)
            streak = streak + 1 if result.get("skipped_nonfinite") else 0
            if streak >= MAX_NONFINITE_STEPS:
                raise _diverged(position.step + 1, streak, result)
            position = RunPosition(position.step + 1, position.data_position + t.batch_size)
            tallies = reducer.combine(step_tallies(groups, stats, learner.weight_version, spec.reward_names))
            row = {"step": position.step, **step_metrics(tallies), **result,
                   "timing/train_s": time.perf_counter() - training, "timing/wait_generation_s": waited,
                   "timing/elapsed_s": time.perf_counter() - started, "weight_version": learner.weight_version}
            if eval_due(config.eval_every, position.step, t.max_steps):
                row.update(await evaluate(config, spec, learner, traces, position.step))
            if logger is not None:
                logger.log(row)
            progress.report(row)
            if (config.save_every > 0 and position.step % config.save_every == 0) or position.step == t.max_steps:
                await learner.save(position)
    finally:
        await _cancel(pending)
        traces.close()
        if logger is not None:
            logger.close()
        progress.close()
    if logger is None:
        return []
    failed = any(row.get(f"stop/{StopReason.REWARD_ERROR.value}") for row in logger.rows)  # then read the traces
    finish_run(logger.rows, spec.run_dir, f"{config.env} · {spec.model} · {spec.backend}", spec.artifacts,
               reward_failure(spec.run_dir) if failed else None)
    return logger.rows


def eval_rows(config: Any, env: Any) -> Any:
    """The held-out rows ``eval_every`` evaluates on (None when it is off; validation refused a run
    whose environment has none)."""
    return held_out_rows(env.get_eval_dataset(), config.eval_examples) if config.eval_every > 0 else None


def held_out_rows(dataset: Any, eval_examples: int) -> Any:
    """The rows every backend evaluates on: the eval split's first ``eval_examples`` (all with 0), so the
    shared loop, TRL's evaluation and verl's validation roll out the same rows."""
    return dataset.select(range(eval_examples)) if 0 < eval_examples < len(dataset) else dataset


def eval_due(eval_every: int, step: int, max_steps: int) -> bool:
    """Whether step ``step`` ends with an evaluation: every ``eval_every`` steps and after the last, as
    TRL (``eval_steps``) and verl (``test_freq``) evaluate (0: never)."""
    return eval_every > 0 and (step % eval_every == 0 or step == max_steps)


async def evaluate(config: Any, spec: RunSpec, learner: Learner, traces: Any, step: int) -> dict[str, Any]:
    """Rollouts of the held-out rows on the weights after ``step``, scored as training scores them:
    the step row's ``eval/*`` keys. Always the same rows (``eval_rows``) and one seed, so an
    evaluation's change is the weights'. Its episodes are traced with ``split: eval``; nothing trains
    on them."""
    rows = [dict(row) for row in spec.eval_dataset]
    groups = await learner.start_batch(rows, {**spec.sampling_args, "seed": batch_seed(config.seed, EVAL_SEED_STEP)})
    traces.write_groups(groups, step=step, split="eval")
    _, stats = groups_to_samples(groups, config.trainer.max_completion_length)
    metrics = step_metrics(spec.reducer.combine(step_tallies(groups, stats, learner.weight_version, spec.reward_names)))
    per_function = [f"reward/{name}/{moment}" for name in spec.reward_names for moment in ("mean", "std")]
    return {f"eval/{key}": metrics[key] for key in (*EVAL_KEYS, *per_function)}


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
