"""Traces: every episode as one JSONL line with its provenance, re-scorable offline.

A trace line is the full rollout record (``bridges.envs.results.state_to_record``: messages, answer,
info, token ids, reward, metrics, stop reason, error) plus where it came from (backend, engine,
model, weight version, sampling args, environment id/args, seed, step) and the advantage it was
trained with. Lines are flushed as each group finishes, so a crash loses no finished episode.

The file is ``traces.jsonl.gz``: each write is one gzip member appended whole (a step's groups in the
shared loop), and concatenated members are one gzip file to every reader (``gzip``, ``zcat``,
``datasets``' json loader). Compressed, the default run's 64,000 episodes take about 5 MB instead of
94 MB. A member cut by a kill is dropped, as a cut line was. ``read_traces`` also reads a plain
``traces.jsonl`` (runs written before, a results file).
"""

from __future__ import annotations

import fcntl
import gzip
import json
import os
import zlib
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from bridges.envs.types import StopReason
from bridges.runtime.errors import ConfigError
from bridges.workflows.types import Group

TRACES_FILE = "traces.jsonl.gz"
PLAIN_TRACES_FILE = "traces.jsonl"  # what runs wrote before traces were compressed; still read
CHUNK_BYTES = 1 << 20
FAILED_REWARD = f'"stop_reason": "{StopReason.REWARD_ERROR.value}"'.encode()  # as json.dumps writes it


def traces_path(run_dir: str | Path) -> Path:
    """The run's trace file: the compressed one, or a plain one an earlier version wrote."""
    folder = Path(run_dir)
    plain = folder / PLAIN_TRACES_FILE
    return plain if plain.exists() and not (folder / TRACES_FILE).exists() else folder / TRACES_FILE


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
            _keep_complete(self.path, resume_step)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write_group(self, group: Group, **extra: Any) -> int:
        """Append one line per episode of ``group``; returns the number of lines written."""
        return self.write_groups([group], **extra)

    def write_groups(self, groups: list[Group], **extra: Any) -> int:
        """Append the episodes of ``groups`` as one member (a step's: compressed together, about half
        the size of a member per group); returns the number of lines written."""
        lines = [
            self._line(state, group.advantages[index] if index < len(group.advantages) else 0.0, extra)
            for group in groups for index, state in enumerate(group.states)
        ]
        if lines:
            self._append("".join(lines))
        return len(lines)

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
        raw = text.encode()
        data = memoryview(gzip.compress(raw, compresslevel=6) if self.path.suffix == ".gz" else raw)
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
    """A training run's ``metrics.jsonl`` logger and ``traces.jsonl.gz`` writer, both cut back to ``step``
    (the checkpoint a resumed run starts from), with the provenance every trace line carries. A process
    that is not the ``main`` one gets no logger and a writer that only appends."""
    import dataclasses

    from bridges.runs.metrics import MetricsLogger

    logger = (MetricsLogger(run_dir, dataclasses.asdict(config), config.report_to, resume_step=step,
                            wandb_project=config.wandb.resolved_project(), wandb_entity=config.wandb.resolved_entity())
              if main else None)
    provenance = {"backend": backend, "engine": engine, "model": model, "env_id": config.env,
                  "env_args": config.env_args, "sampling_args": sampling_args, "seed": config.seed}
    return logger, TraceWriter(run_dir / TRACES_FILE, provenance, resume_step=step, tidy=main)


def gzip_member_lines(stream: BinaryIO, name: str | Path) -> Generator[bytes, None, int]:
    """The lines of every complete gzip member of ``stream``, member by member; a member cut short (a
    kill mid-write) is not read. Returns how many of the stream's bytes were complete members."""
    member, pending, read, sound = zlib.decompressobj(wbits=31), b"", 0, 0
    data = stream.read(CHUNK_BYTES)
    read += len(data)
    while data:
        try:
            pending += member.decompress(data)
        except zlib.error:  # not a cut end (that is dropped below) but damage inside the file
            raise ConfigError(f"{name} is not a readable gzip file past byte {read - len(data)}; "
                              "the trace file is corrupted.") from None
        if member.eof:
            yield from pending.splitlines(keepends=True)
            sound = read - len(member.unused_data)
            data, member, pending = member.unused_data, zlib.decompressobj(wbits=31), b""
        else:
            data = b""
        if not data:
            data = stream.read(CHUNK_BYTES)
            read += len(data)
    return sound


def _plain_lines(stream: BinaryIO) -> Generator[bytes, None, int]:
    """The complete lines of a plain file (a cut last line, from a kill mid-write, is not read); returns
    how many of its bytes they are."""
    sound = 0
    for line in stream:
        if line.endswith(b"\n"):
            sound += len(line)
            yield line
    return sound


def raw_trace_lines(path: Path) -> Generator[bytes, None, int]:
    """The complete lines of a trace file, compressed or plain, as bytes (what ``read_traces`` parses);
    returns how many of the file's bytes held them (the whole file when nothing was cut)."""
    with path.open("rb") as stream:
        return (yield from gzip_member_lines(stream, path) if path.suffix == ".gz" else _plain_lines(stream))


def _keep_complete(path: Path, step: int | None) -> None:
    """Before appending: rewrite ``path`` with its complete records only (what a kill cut is dropped, or
    the next write would be glued to it) and, for a run resumed from ``step``, none of a later step
    (they run again). Read once; written to a staging file, then renamed, only when that changes it."""
    if not path.exists() or path.stat().st_size == 0:
        return
    kept, changed, lines = [], False, raw_trace_lines(path)
    while True:
        try:
            line = next(lines)
        except StopIteration as end:
            sound = end.value
            break
        try:
            line_step = (json.loads(line).get("provenance") or {}).get("step") if step is not None else None
        except (json.JSONDecodeError, AttributeError):
            line_step = None
        if step is None or not isinstance(line_step, int) or line_step <= step:
            kept.append(line)
        else:
            changed = True
    if not changed and sound == path.stat().st_size:
        return
    body = b"".join(kept)
    staging = path.with_name(path.name + ".tmp")
    staging.write_bytes(gzip.compress(body, compresslevel=6) if path.suffix == ".gz" and body else body)
    staging.replace(path)


def read_traces(path: str | Path) -> Iterator[dict[str, Any]]:
    """Yield trace lines of a ``traces.jsonl.gz`` or a plain ``traces.jsonl`` / ``results.jsonl``;
    what a crash cut short at the end is skipped, not fatal."""
    path = Path(path)
    for number, line in enumerate(raw_trace_lines(path), 1):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError:
            raise ConfigError(f"{path}:{number} is not valid JSON; the trace file is corrupted.") from None


def reward_failures(run_dir: str | Path) -> tuple[int, int, dict[str, Any] | None]:
    """(rollouts whose reward function failed, rollouts traced, the first such trace line) of a run's
    traces: what the end of a run quotes, so a failing reward is read in one line, not found in a file."""
    path = traces_path(run_dir)
    if not path.exists():
        return 0, 0, None
    failed, total, first = 0, 0, None
    for raw in raw_trace_lines(path):  # parsed only where the text says so: a run's traces are large
        if b'"split": "eval"' in raw:
            continue
        total += 1
        if FAILED_REWARD in raw:
            failed += 1
            first = first or json.loads(raw)
    return failed, total, first


def reward_failure(run_dir: str | Path) -> str | None:
    """The sentence a run ends on when a reward function failed: its own message, the first example, and
    how many rollouts were masked for it (None when none failed)."""
    failed, total, first = reward_failures(run_dir)
    if first is None:
        return None
    return (f"{str(first.get('error') or 'a reward function failed').rstrip('.')} (example {first.get('example_id')}; "
            f"{failed} of {total} rollouts masked, not trained on, each with its error in {traces_path(run_dir)})")
