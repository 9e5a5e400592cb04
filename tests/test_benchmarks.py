"""The orchestration benchmarks run end to end at a small size and print the figures they promise.

The figures themselves are measured by hand (README); what is checked here is that every phase of
the per-phase breakdown still finds the functions it wraps (a rename would silently read 0) and
that the peer benchmark's three paths all complete every rollout.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _fields(line: str) -> dict[str, float]:
    return {key: float(value) for key, value in re.findall(r"(\w+)=([-\d.]+)", line)}


def test_rollout_scale_prints_cpu_per_call_and_every_phase_claims_time():
    out = _run("benchmarks/rollout_scale.py", "--rollouts", "60", "--latency", "0.001", "--phases")
    last = _fields(out.strip().splitlines()[-1])
    assert last["rollouts"] == 60 and last["cpu_us_per_call"] > 0 and last["seconds"] > 0
    phases = dict(re.findall(r"^  (.+?)\s{2,}(-?[\d.]+) us", out, flags=re.M))
    for phase in ("render (jinja)", "tokenizer", "ledger", "drift measurement (own)", "responses (pydantic)",
                  "client (own)", "environment hooks", "scoring", "environment loop (own)"):  # fmt: skip
        assert float(phases[phase]) > 0, phase
    # the instrumented wave does the same work as the timed one, plus the wrappers' own cost
    assert float(phases["total (CPU per model call)"]) > 0.5 * last["cpu_us_per_call"]


def test_peer_benchmark_runs_all_three_paths():
    out = _run("benchmarks/vs_verifiers.py", "--rollouts", "30", "--latency", "0.001")
    rows = re.findall(r"^\s+30 rollouts\s+(\w+)\s.*\((\d+) calls\)", out, flags=re.M)
    assert dict(rows) == {"verifiers": "90", "bridges": "90", "vf_adapter": "90"}  # 30 rollouts x 3 turns
    last = _fields(out.strip().splitlines()[-1])
    assert last["ratio"] > 0 and last["vf_adapter_ratio"] > 0 and last["cpu_us_per_call"] > 0
