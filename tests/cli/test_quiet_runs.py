"""A default run prints its progress and its result, nothing else: no warning, no per-step dict, no
library bar. Each backend's default command, shortened to a few steps (what would repeat per step or
per rollout shows in three)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

RESULT = re.compile(r"^reward: first \d+ steps [\d.]+ -> last \d+ steps [\d.]+ over 3 steps$")


def train(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONWARNINGS", "TINKER_API_KEY")}
    env["PYTHONPATH"] = str(Path(__file__).parents[1] / "grpo" / "envs")  # bridges_test_dense_env
    return subprocess.run([sys.executable, "-m", "bridges.train", "trainer.max_steps=3", *args],
                          capture_output=True, text=True, timeout=600, env=env)


def screen_lines(stream: str) -> list[str]:
    """What a terminal shows, bar redraws split apart."""
    return [line.strip() for line in stream.replace("\r", "\n").splitlines() if line.strip()]


def assert_only_progress_and_result(done: subprocess.CompletedProcess[str], bar: str) -> None:
    assert done.returncode == 0, done.stderr[-3000:]
    stderr = screen_lines(done.stderr)
    assert stderr and all(line.startswith(f"{bar}:") for line in stderr), stderr[:10]
    assert not any("warn" in line.lower() for line in stderr)
    stdout = screen_lines(done.stdout)
    assert stdout[0].startswith("template check: ") and stdout[-1].startswith("run written to ")
    assert RESULT.match(stdout[-2]), stdout
    assert len(stdout) <= 4, stdout  # (verl adds one line: where its own log is)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("backend", "args"),
    [("grpo", []), ("trl", ["backend=trl"]), ("tinker", ["backend=tinker", "tinker.base_url=local"])],
)
def test_a_default_run_shows_its_progress_bar_and_its_result_only(backend: str, args: list[str]):
    assert_only_progress_and_result(train(*args), backend)


def test_without_a_bar_each_step_is_one_line_and_stderr_is_empty():
    done = train("trainer.batch_size=2", "trainer.group_size=2", "progress=false", "env=bridges_test_dense_env")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr == ""
    steps = [line for line in screen_lines(done.stdout) if line.startswith("step ")]
    assert [line.split(":")[0] for line in steps] == ["step 1", "step 2", "step 3"]
    assert all(re.fullmatch(r"step \d: reward=[\d.]+ loss=-?[\d.]+ masked=\d+", line) for line in steps), steps
