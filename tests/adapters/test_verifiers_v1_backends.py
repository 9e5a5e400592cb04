"""The bundled v1 taskset trains two steps on every backend, each sample holding the sampled ids.

Runs in the main environment only (the backends are dev extras there); the v1 core runs under both
verifiers releases in ``test_verifiers_v1.py``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from trace_files import run_traces

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
# the bundled taskset with a second reward a random model varies on: two steps of a letter reward alone
# would train nothing whenever no rollout hits a letter (a sampler's luck)
SMALL = ["env=vf_v1_dense_letter_taskset", "progress=false", "trainer.max_steps=2", "trainer.batch_size=2",
         "trainer.group_size=4", "run_name=v1"]


@pytest.fixture(autouse=True)
def _fixtures_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(FIXTURES))  # the dense tasksets every test here trains on


def _rows(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _check_run(run_dir: Path, backend: str) -> None:
    rows = _rows(run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["episodes/total"] == 8 and r["episodes/masked_fraction"] == 0.0 for r in rows)
    assert all(0.0 <= r["reward/mean"] <= 2.0 for r in rows)  # scored by the taskset's own @vf.reward
    if backend == "trl":  # TRL keeps no traces file; its rows carry the environment's metrics
        assert all(r["env/num_turns"] == 1.0 and r["rewards/trace_reward/mean"] is not None and r["env/repeated_letter"] is not None for r in rows)
        return
    traces = run_traces(run_dir)
    assert len(traces) == 16 and {t["provenance"]["env_id"] for t in traces} == {"vf_v1_dense_letter_taskset"}
    for trace in traces:
        (turn,) = trace["turns"]
        assert 0 < len(turn["completion_ids"]) == len(turn["logprobs"]) <= 6  # the env's agent caps at 6


@pytest.mark.parametrize("backend", ["grpo", "trl", "tinker"])
def test_two_steps_on_each_in_process_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str):
    from bridges.train import main

    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    extra = ["tinker.base_url=local"] if backend == "tinker" else []
    assert main([f"backend={backend}", f"output_dir={tmp_path}", *SMALL, *extra]) == 0
    _check_run(tmp_path / "v1", backend)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["grpo", "trl", "tinker"])
def test_a_multi_agent_env_trains_each_seat_in_groups_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str
):
    """Rows are task × trainable seat, so a group is one seat's rollouts of one task on every backend."""
    from bridges.train import main

    monkeypatch.syspath_prepend(str(FIXTURES))
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    extra = ["tinker.base_url=local"] if backend == "tinker" else []
    # a second reward that always spreads, so a run never trains nothing by chance (a tiny random model
    # rarely hits the letter: whether a seeded run does is the sampler's luck)
    extra += ["env_args.dense=true"]
    argv = [f"backend={backend}", f"output_dir={tmp_path}", "env=vf_v1_duel_taskset", "env_args.rounds=1",
            "progress=false", "trainer.max_steps=2", "trainer.batch_size=2", "trainer.group_size=2",
            "sampling.max_tokens=6", "run_name=duel", *extra]
    assert main(argv) == 0
    rows = _rows(tmp_path / "duel")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["episodes/total"] == 4 and r["episodes/masked_fraction"] == 0.0 for r in rows)
    if backend == "trl":
        return
    traces = run_traces(tmp_path / "duel")
    assert len(traces) == 8
    for trace in traces:  # one segment each (rounds=1): the seat's own conversation, its own reward
        seat = _info(trace)["v1_seat"]
        assert seat in ("player0", "player1") and len(trace["turns"]) == 1
        first = trace["completion"][0]
        assert (first["role"], first["content"]) == ("system", f"You are player {seat[-1]}.")
        metrics = trace["metrics"]
        assert trace["reward"] == pytest.approx(metrics["hits"] + metrics["lowercase"])  # both its own seat's
    # a batch is one task's two seat rows (kept adjacent): each hand trains both seats, so of every
    # step's four rollouts two played their episode and two took their seat's trace from it
    for step in (1, 2):
        shared = [t["metrics"]["v1/shared_episode"] for t in traces if t["provenance"]["step"] == step]
        assert sorted(shared) == [0.0, 0.0, 1.0, 1.0], shared


def _info(trace: dict[str, Any]) -> dict[str, Any]:
    info = trace["info"]
    return info if isinstance(info, dict) else json.loads(info)


def test_verls_agent_loop_worker_trains_on_the_sampled_ids(
    tmp_path: Path, tiny_path: Path, tiny_tokenizer: Any
):
    from recording_server import RecordingServer
    from verl_harness import N, batch_of, compose, rows_of, run_worker

    cfg, files = compose(tmp_path, tiny_path, "", env="repeat_letter_taskset")
    client = RecordingServer(str(tiny_path))
    rows = rows_of(run_worker(cfg, batch_of(cfg, files, tiny_tokenizer), client), cfg)
    assert len(rows) == 2 * N
    sampled = sorted(ids for turns in client.sampled.values() for ids, _ in turns)
    assert sorted(row["response"] for row in rows) == sampled  # one model turn each, exactly as sampled
    for row in rows:
        assert (
            row["valid"] and row["stop"] == "completed" and all(row["mask"]) and 0 < len(row["response"]) <= 6
        )
        letter = tiny_tokenizer.decode(row["prompt"]).split("user\n")[-1][0]
        head = tiny_tokenizer.decode(row["response"])[:6]
        assert row["reward"] == pytest.approx(sum(ch == letter for ch in head) / 6)


def test_verls_agent_loop_worker_runs_a_multi_agent_env_seat_by_seat(
    tmp_path: Path, tiny_path: Path, tiny_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
):
    """verl's rows are ours: task 0's two seats, each a group of N; a seat's two resumed segments
    are one response, the env's turn between them masked out."""
    from recording_server import RecordingServer
    from verl_harness import N, batch_of, compose, rows_of, run_worker

    monkeypatch.syspath_prepend(str(FIXTURES))
    seats = [f"env_args.player{i}.sampling.max_tokens=6" for i in (0, 1)]  # per turn; verl's budget is 160
    cfg, files = compose(tmp_path, tiny_path, "", "env_args.rounds=2", *seats, env="vf_v1_duel_taskset")
    rows = rows_of(run_worker(cfg, batch_of(cfg, files, tiny_tokenizer), RecordingServer(str(tiny_path))), cfg)
    assert len(rows) == 2 * N
    for row in rows:
        assert row["valid"] and row["stop"] == "completed", row["error"]
        assert row["metrics"]["v1/seat_traces"] == 1.0 and row["reward"] == pytest.approx(row["metrics"]["hits"])
        assert 0 < sum(row["mask"]) < len(row["mask"]) and row["mask"][0] == 1 and row["mask"][-1] == 1


def test_a_synchronous_grpo_run_is_the_native_tasks_run_step_for_step(tmp_path: Path):
    """num_batches_ahead=0 takes timing out of the run: the v1 taskset and repeat_letter, on the same
    rows and seeds, must give the same rewards and losses at every step (the async default pipelines
    by wall time, so there the two runs part after a few steps and both learn)."""
    from bridges.train import main

    runs = {}
    # the same task twice with a reward that spreads (the letter's, and the share of lowercase letters)
    for env in ("bridges_test_dense_letter_env", "vf_v1_dense_letter_taskset"):
        argv = [f"env={env}", "progress=false", "trainer.max_steps=3", "trainer.batch_size=2", "trainer.group_size=4",
                "trainer.num_batches_ahead=0", f"output_dir={tmp_path}", f"run_name={env}"]
        assert main(argv) == 0
        runs[env] = _rows(tmp_path / env)
    native, v1 = runs["bridges_test_dense_letter_env"], runs["vf_v1_dense_letter_taskset"]
    assert len(native) == len(v1) == 3
    for a, b in zip(native, v1, strict=True):  # the same samples, so the same step
        assert (b["reward/mean"], b["samples/trained"]) == (a["reward/mean"], a["samples/trained"])
        # sampled logprobs enter the loss; the engine's batch shapes (timing) move fp32 sums in the 7th digit
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4, abs=1e-6)


def test_bridges_compare_evaluates_a_v1_taskset_on_two_backends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from bridges.compare import main

    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    argv = ["env=repeat_letter_taskset", "backends=[grpo,tinker]", "model=tiny", "num_examples=4",
            f"output={tmp_path}", "progress=false"]
    assert main(argv) == 0
    report = (tmp_path / "report.md").read_text()
    assert "| grpo |" in report and "| tinker |" in report and "repeat_letter_taskset" in report


@pytest.mark.slow
def test_kill_9_mid_rollout_leaves_no_toolset_server_running(tmp_path: Path):
    """verifiers starts a toolset server per rollout and ties it to its launcher's life; one still
    importing when its launcher is killed cannot know yet, and exits once it has started (~15 s here)."""
    import os
    import signal
    import subprocess
    import sys
    import time
    import uuid

    from process_marks import processes_marked

    argv = [sys.executable, "-m", "bridges.eval", "env=vf_v1_tools_taskset", "model=tiny", "num_examples=2",
            "progress=false", f"output={tmp_path / 'out'}"]
    job_id = uuid.uuid4().hex  # this job's processes, and no other test's, carry it in their environment
    mark = f"BRIDGES_TEST_JOB={job_id}"
    log = tmp_path / "job.log"
    with log.open("w") as sink:
        job = subprocess.Popen(argv, env={**os.environ, "PYTHONPATH": str(FIXTURES), "BRIDGES_TEST_JOB": job_id},
                               stdout=sink, stderr=subprocess.STDOUT)

    def servers() -> list[int]:  # the job's processes but the launcher: the toolset servers it started
        return [pid for pid in processes_marked(mark) if pid != job.pid]

    deadline = time.monotonic() + 240  # a loaded CI machine (the whole suite on 2 cores) starts them slowly
    while not servers() and time.monotonic() < deadline and job.poll() is None:
        time.sleep(0.1)
    assert servers(), f"no toolset server seen (job exit code {job.poll()}): {log.read_text()[-2000:]}"
    os.kill(job.pid, signal.SIGKILL)
    job.wait()
    deadline = time.monotonic() + 60
    while servers() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert servers() == []



@pytest.mark.slow
@pytest.mark.skipif(shutil.which("uv") is None, reason="uv is in the dev extra; verifiers' programs need it")
@pytest.mark.parametrize("backend", ["grpo", "trl", "tinker"])
def test_an_agent_on_the_bash_program_harness_trains_on_each_in_process_backend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str
):
    """verifiers' default coding agent, its uv program on the subprocess runtime, answered by the
    backend's engine: two steps, nothing masked, the samples' ids the sampled ones (checked per trace)."""
    from bridges.train import main

    monkeypatch.syspath_prepend(str(FIXTURES))
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    extra = ["tinker.base_url=local"] if backend == "tinker" else []
    argv = [f"backend={backend}", f"output_dir={tmp_path}", "env=vf_v1_bash_dense_taskset", "progress=false",
            "trainer.max_steps=2", "trainer.batch_size=1", "trainer.group_size=2", "sampling.max_tokens=16",
            "run_name=bash", *extra]
    assert main(argv) == 0
    rows = _rows(tmp_path / "bash")
    assert [r["step"] for r in rows] == [1, 2] and all(r["episodes/masked_fraction"] == 0.0 for r in rows)
    if backend != "trl":
        traces = run_traces(tmp_path / "bash")
        assert len(traces) == 4 and all(0 < len(t["turns"][0]["completion_ids"]) == len(t["turns"][0]["logprobs"])
                                        for t in traces)


@pytest.mark.skipif(shutil.which("uv") is None, reason="uv is in the dev extra; verifiers' programs need it")
def test_verls_agent_loop_worker_runs_a_bash_program_agent(tmp_path: Path, tiny_path: Path, tiny_tokenizer: Any,
                                                          monkeypatch: pytest.MonkeyPatch):
    from recording_server import RecordingServer
    from verl_harness import N, batch_of, compose, rows_of, run_worker

    monkeypatch.syspath_prepend(str(FIXTURES))
    cfg, files = compose(tmp_path, tiny_path, "", "env_args.taskset.num_tasks=2", env="vf_v1_bash_taskset")
    client = RecordingServer(str(tiny_path))
    rows = rows_of(run_worker(cfg, batch_of(cfg, files, tiny_tokenizer), client), cfg)
    assert len(rows) == 2 * N and all(row["valid"] and row["stop"] == "completed" for row in rows), [r["error"] for r in rows]
    sampled = sorted(ids for turns in client.sampled.values() for ids, _ in turns)
    assert sorted(row["response"] for row in rows) == sampled  # the program's one model call each, as sampled
