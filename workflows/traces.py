"""Traces: every episode as one JSONL line with its provenance, re-scorable offline.

A trace line is the full rollout record (``bridges.envs.results.state_to_record``: messages, answer,
info, token ids, reward, metrics, stop reason, error) plus where it came from (backend, engine,
model, weight version, sampling args, environment id/args, seed, step) and the advantage it was
trained with. Lines are flushed as each group finishes, so a crash loses no finished episode.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bridges.runtime.errors import ConfigError
from bridges.workflows.types import Group


class TraceWriter:
    """Appends episodes; ``resume_step`` (a training run resumed from that step's checkpoint) first cuts
    the file back to the lines of steps up to it, so the steps run again after a crash appear once.

    Several processes may append to one file (the trainer's ranks, verl's agent-loop workers): each
    group's lines go out in one ``write`` under an exclusive ``flock``, so lines never interleave.
    ``tidy=False`` opens without cutting anything (a process that is not the one preparing the file).
    """

    def __init__(
        self, path: str | Path, provenance: dict[str, Any], resume_step: int | None = None, *, tidy: bool = True
    ):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.provenance = dict(provenance)
        if tidy:
            _drop_partial_last_line(self.path)
            if resume_step is not None:
                _keep_steps_up_to(self.path, resume_step)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write_group(self, group: Group, **extra: Any) -> int:
        """Append one line per episode of ``group``; returns the number of lines written."""
        lines = [
            self._line(state, group.advantages[index] if index < len(group.advantages) else 0.0, extra)
            for index, state in enumerate(group.states)
        ]
        self._append("".join(lines))
        return len(group.states)

    def write_state(self, state: Any, advantage: float | None = None, **extra: Any) -> None:
        """One rollout scored on its own (verl computes advantages after the rollout: ``None`` here)."""
        self._append(self._line(state, advantage, extra))

    def _line(self, state: Any, advantage: float | None, extra: dict[str, Any]) -> str:
        from bridges.envs.results import state_to_record

        record = state_to_record(state)
        record["advantage"] = advantage
        versions = [t.weight_version for t in state.turns if t.weight_version is not None]
        provenance = {**self.provenance, "weight_version": min(versions) if versions else None, **extra}
        return json.dumps({**record, "provenance": provenance}) + "\n"

    def _append(self, text: str) -> None:
        data = memoryview(text.encode())
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            while data:
                data = data[os.write(self._fd, data) :]
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_run_files(
    config: Any,
    run_dir: Path,
    backend: str,
    engine: str,
    model: str,
    sampling_args: dict[str, Any],
    step: int,
    *,
    main: bool = True,
) -> tuple[Any, TraceWriter]:
    """A training run's ``metrics.jsonl`` logger and ``traces.jsonl`` writer, both cut back to ``step``
    (the checkpoint a resumed run starts from), with the provenance every trace line carries. A process
    that is not the ``main`` one gets no logger and a writer that only appends."""
    import dataclasses

    from bridges.runs.metrics import MetricsLogger

    logger = (MetricsLogger(run_dir, dataclasses.asdict(config), config.report_to, resume_step=step,
                            wandb_project=config.wandb.resolved_project(), wandb_entity=config.wandb.resolved_entity())
              if main else None)
    provenance = {"backend": backend, "engine": engine, "model": model, "env_id": config.env,
                  "env_args": config.env_args, "sampling_args": sampling_args, "seed": config.seed}
    return logger, TraceWriter(run_dir / "traces.jsonl", provenance, resume_step=step, tidy=main)


def _drop_partial_last_line(path: Path) -> None:
    """A run killed mid-write leaves a cut last line; appending after it would glue the next record
    onto it and corrupt both. The cut record was never finished, so it is dropped."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with path.open("rb+") as fh:
        fh.seek(-1, 2)
        if fh.read(1) == b"\n":
            return
        fh.seek(0)
        data = fh.read()
        fh.truncate(data.rfind(b"\n") + 1)


def _keep_steps_up_to(path: Path, step: int) -> None:
    """Rewrite ``path`` without the lines of steps after ``step`` (written, then staged and renamed)."""
    if not path.exists():
        return
    kept = []
    with path.open() as fh:
        for line in fh:
            try:
                line_step = (json.loads(line).get("provenance") or {}).get("step")
            except (json.JSONDecodeError, AttributeError):
                continue
            if not isinstance(line_step, int) or line_step <= step:
                kept.append(line)
    staging = path.with_name(path.name + ".tmp")
    staging.write_text("".join(kept))
    staging.replace(path)


def read_traces(path: str | Path) -> Iterator[dict[str, Any]]:
    """Yield trace lines; a truncated last line (a crash mid-write) is skipped, not fatal."""
    with Path(path).open() as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                if fh.readline() == "":  # only the very last line may be cut short
                    return
                raise ConfigError(
                    f"{path}:{number} is not valid JSON; the trace file is corrupted."
                ) from None
