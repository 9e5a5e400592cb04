"""The trainer on several processes (gloo on this CPU, the same code NCCL runs on GPUs): one step on two
processes gives the weights one process gives on the same global batch, under ddp and fsdp, full and
LoRA; a two-process run of the default task learns and writes every episode once; killing one process
ends the job in one sentence, and resume continues it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from safetensors.torch import load_file
from trace_files import run_traces

from bridges.runtime.launch import launch

SUPPORT = Path(__file__).resolve().parents[1] / "support"
ONE_STEP = ["trainer.learning_rate=1e-3", "trainer.max_grad_norm=1e6", "trainer.device=cpu", "trainer.dtype=fp32"]


def one_step(out: Path, processes: int, *args: str) -> dict:
    os.environ["PYTHONPATH"] = os.pathsep.join([str(SUPPORT), os.environ.get("PYTHONPATH", "")])
    argv = [str(out), *ONE_STEP, *args]
    if processes == 1:
        done = subprocess.run([sys.executable, "-m", "one_step", *argv], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
    else:
        assert launch("one_step", argv, processes, out.parent) == 0
    return load_file(str(out))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("strategy", "lora", "aggregation"),
    [("ddp", False, "sample"), ("fsdp", False, "sample"), ("ddp", True, "sample"), ("fsdp", True, "sample"),
     ("fsdp", False, "token")],
    ids=["ddp", "fsdp", "ddp-lora", "fsdp-lora", "fsdp-token"],
)
def test_two_processes_take_the_step_one_process_takes(tmp_path: Path, strategy: str, lora: bool, aggregation: str,
                                                       monkeypatch):
    """token: the step's mean over its loss tokens, counted over both processes (completions of 2 to 9 ids)."""
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    extra = [f"trainer.strategy={strategy}", *(["trainer.lora_rank=4"] if lora else []), "trainer.grad_accum_steps=2",
             f"trainer.loss_aggregation={aggregation}"]
    single = one_step(tmp_path / "one.safetensors", 1, *extra)
    double = one_step(tmp_path / "two.safetensors", 2, *extra)
    assert set(single) == set(double) and len(single) > 1
    if lora:
        assert all("lora_" in name for name in single if not name.startswith("result."))
    loss, grad_norm, _ = single.pop("result.loss").tolist()
    loss2, grad_norm2, sharded = double.pop("result.loss").tolist()
    assert sharded == float(strategy == "fsdp")  # fsdp really sharded the parameters (DTensors)
    assert abs(loss - loss2) < 1e-6 and abs(grad_norm - grad_norm2) < 1e-5 * max(1.0, grad_norm)
    for name, tensor in single.items():
        assert (tensor - double[name]).abs().max().item() < 1e-5, name


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def train(*args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "bridges.train", "progress=false", *args], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_two_processes_learn_the_default_task_and_write_every_episode_once(tmp_path: Path):
    done = train("trainer.num_processes=2", "trainer.max_steps=80", cwd=tmp_path)
    out, err = done.communicate(timeout=900)
    assert done.returncode == 0, err[-3000:]
    assert out.count("step 80:") == 1 and out.count("reward: first") == 1  # the main process reports, once
    run = tmp_path / "runs" / "grpo-repeat_letter"
    rewards = [row["reward/mean"] for row in lines(run / "metrics.jsonl")]
    assert len(rewards) == 80
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    assert last > max(0.06, 3 * first), (first, last)
    traces = run_traces(run)  # both processes appended whole gzip members to one file
    assert len(traces) == len({json.dumps(t, sort_keys=True) for t in traces}) == 80 * 256  # each exactly once
    assert Counter(t["provenance"]["step"] for t in traces) == {s: 256 for s in range(1, 81)}


def _workers(launcher: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(launcher)], capture_output=True, text=True).stdout.split()
    return [int(pid) for pid in found]


@pytest.mark.slow
def test_killing_one_process_stops_the_job_in_one_sentence_and_resume_continues(tmp_path: Path):
    args = ["trainer.num_processes=2", "trainer.max_steps=6", "save_every=2", "keep_checkpoints=10",
            "trainer.batch_size=4", "trainer.group_size=4"]
    run = tmp_path / "runs" / "grpo-repeat_letter"
    job = train(*args, cwd=tmp_path)
    deadline = time.monotonic() + 300
    while not (run / "checkpoints" / "step_000002").exists() or len(lines(run / "metrics.jsonl")) < 3:
        assert job.poll() is None and time.monotonic() < deadline, job.communicate()[1][-3000:]
        time.sleep(0.05)
    workers = _workers(job.pid)
    assert len(workers) == 2
    os.kill(workers[1], signal.SIGKILL)
    killed = time.monotonic()
    _, err = job.communicate(timeout=60)
    assert time.monotonic() - killed < 15 and job.returncode == 2
    error_lines = [x for x in err.splitlines() if x.startswith("error:")]
    assert len(error_lines) == 1 and "was killed by signal 9" in error_lines[0] and "resume=true" in error_lines[0]
    assert "Traceback" not in err.split(error_lines[0])[-1]
    for pid in workers:  # nothing outlives the job
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)

    resumed = train(*args, "resume=true", cwd=tmp_path)
    out, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err[-3000:]
    assert "resumed from" in out and out.count("resumed from") == 1
    assert [row["step"] for row in lines(run / "metrics.jsonl")] == [1, 2, 3, 4, 5, 6]
    steps = Counter(row["provenance"]["step"] for row in run_traces(run))
    assert steps == {step: 16 for step in range(1, 7)}  # each step's episodes exactly once
