"""The same command with the same seed on the same machine gives the same run: every reward, loss and count
in metrics.jsonl, and the weights each batch sampled with, with the default asynchronous overlap on.

Why it holds: the data order and each step's sampling seed are functions of the seed and the step
(``rows_at``, ``batch_seed``); the sampler's noise is a function of the row's seed and the token's
index (counter-based, not a generator's state); the engine decodes a step's whole batch together and
a weight push waits for the batch it would otherwise change (``weight_lock``), so batch s samples the
weights of the last step pushed before it started, whatever the threads' timing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from trace_files import run_traces

COMMAND = [sys.executable, "-m", "bridges.train", "progress=false", "trainer.max_steps=16", "trainer.batch_size=8"]


def run(folder: Path) -> tuple[list[dict], list[tuple[int, int]]]:
    done = subprocess.run([*COMMAND, f"output_dir={folder}"], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-1500:]
    run_dir = folder / "grpo-repeat_letter"
    rows = [{k: v for k, v in json.loads(x).items() if not k.startswith("timing/")}
            for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    lines = [x["provenance"] for x in run_traces(run_dir)]
    return rows, [(p["step"], p["weight_version"]) for p in lines]


@pytest.mark.slow
def test_the_same_seed_gives_the_same_metrics_and_the_same_weight_schedule(tmp_path: Path):
    first, schedule = run(tmp_path / "a")
    second, again = run(tmp_path / "b")
    assert len(first) == 16 and first == second
    assert schedule == again
    assert len({r["reward/mean"] for r in first}) > 1 and any(r["loss"] for r in first)  # it trained
    # one batch ahead: step s samples the weights pushed after step s - 2 (version 1 is the start)
    assert {v for s, v in schedule if s <= 2} == {1} and all(v < s for s, v in schedule if s > 2)
