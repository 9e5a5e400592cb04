"""SIGKILL ``bridges.train`` mid-run, then ``resume=true``: no checkpoint or finished episode is lost."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from trace_files import run_traces

REPO = Path(__file__).resolve().parents[2]
ARGS = [
    "trainer.max_steps=6", "save_every=2", "keep_checkpoints=10", "trainer.batch_size=4", "trainer.group_size=4",
    "progress=false",
]


def start(tmp_path: Path, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "bridges.train", *ARGS, *extra]
    return subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def test_sigkill_then_resume_continues_from_the_last_checkpoint(tmp_path: Path):
    run_dir = tmp_path / "runs" / "grpo-repeat_letter"
    process = start(tmp_path)
    deadline = time.monotonic() + 240
    while (
        not (run_dir / "checkpoints" / "step_000002").exists()
        or len((run_dir / "metrics.jsonl").read_text().splitlines()) < 3
    ):
        assert process.poll() is None, process.stdout.read() if process.stdout else ""
        assert time.monotonic() < deadline, "the run did not reach step 3"
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    latest = max(int(p.name.removeprefix("step_")) for p in (run_dir / "checkpoints").glob("step_*"))
    killed_traces = run_traces(run_dir)  # whole members only: a member the kill cut is not read
    finished_before = {line["provenance"]["step"] for line in killed_traces}
    assert {1, 2} <= finished_before

    resumed = start(tmp_path, "resume=true")
    output, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, output
    assert f"(step {latest}, data position {latest * 4})" in output  # from the last checkpoint on disk
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]  # reads like one straight run
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert checkpoints == ["step_000002", "step_000004", "step_000006"]
    traces = run_traces(run_dir)
    kept = [line for line in killed_traces if line["provenance"]["step"] <= latest]
    assert traces[: len(kept)] == kept  # the checkpointed steps' episodes are kept as written
    per_step = Counter(line["provenance"]["step"] for line in traces)
    assert per_step == {step: 16 for step in range(1, 7)}  # each step's 4 x 4 episodes exactly once
