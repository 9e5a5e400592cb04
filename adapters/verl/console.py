"""What a ``backend=verl`` run shows on the console: the step view every backend shares, not verl's log.

verl's trainer prints its whole resolved config (about 900 lines), every Ray worker's start-up
warnings and a metric dict per step. All of it goes, unchanged, to ``runs/<run>/verl/console.log``
(appended per launch, the command line first); the console shows ``StepProgress`` driven by the
metric rows verl's own file logger writes (``native_metrics.jsonl``), and the run's one-line result.
When verl fails, the last lines of that log are printed with its path, so the reason is on screen.
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bridges.runs.metrics import StepProgress
from bridges.runtime.launch import die_with_parent, stop_processes

CONSOLE_LOG = "verl/console.log"
POLL_S = 0.5
TAIL_LINES = 25
STOP_GRACE_S = 30.0  # how long verl gets to stop its Ray workers after we ask it to


class NativeRows:
    """Reads the training rows verl's file logger appends, as they are written (a last line without its
    newline is left for the next read)."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset = path, 0

    def new_rows(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as file:
                file.seek(self.offset)
                chunk = file.read()
        except FileNotFoundError:
            return []
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self.offset += len(complete)
        rows = []
        for line in complete.splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                entry = json.loads(line)
                data = entry.get("data") if isinstance(entry, dict) else None
                if isinstance(data, dict) and "actor/pg_loss" in data:  # a training step, not validation
                    rows.append({"step": int(entry.get("step", 0)), "reward/mean": data.get("critic/score/mean"),
                                 "loss": data.get("actor/pg_loss")})
        return rows


def log_tail(path: Path, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` lines of verl's console log (progress-bar redraws split into lines)."""
    try:
        text = path.read_bytes()[-200_000:].decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.replace("\r", "\n").splitlines()[-lines:])


_ERROR_LINE = re.compile(r"\b([A-Z]\w*(?:Error|Exception): .+)")


def first_error(path: Path) -> str | None:
    """The first ``SomeError: message`` of verl's console log (a Ray worker's prefix left out): the cause,
    where the last lines are the driver's echo of it."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    found = _ERROR_LINE.search(text.replace("\r", "\n"))
    return found.group(1).strip()[:300] if found else None


def run_verl(command: list[str], env: dict[str, str], run_dir: Path, progress: StepProgress) -> int:
    """Run verl's trainer with its output in the run's console log, reporting each step it logs.
    Returns verl's exit code; verl is stopped (and waited for) if we are interrupted."""
    log_path = run_dir / CONSOLE_LOG
    rows = NativeRows(Path(env["VERL_FILE_LOGGER_PATH"]))
    print(f"verl's own output: {log_path}", flush=True)
    with log_path.open("ab") as log:
        log.write(f"$ {shlex.join(command)}\n".encode())
        log.flush()
        # its own session, sent SIGTERM if we die, even by SIGKILL (Ray's own processes then exit on their own)
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
        try:
            while process.poll() is None:
                time.sleep(POLL_S)
                for row in rows.new_rows():
                    progress.report(row)
            for row in rows.new_rows():
                progress.report(row)
        finally:  # nothing of verl outlives us: its session is asked to stop, then killed
            stop_processes([process], STOP_GRACE_S)
            progress.close()
    if process.returncode != 0:
        print(f"verl's last lines ({log_path} has all of them):\n{log_tail(log_path)}", file=sys.stderr)
    return int(process.returncode)

