"""A process of a two-machine run that dies, hangs or fails ends the run on every machine within a bound, with
one sentence naming it (which process, on which machine, doing what) — never gloo's "Connection reset by
peer" traceback or a wait for a collective timeout (10 minutes); ``torchrun --max-restarts`` resumes from the
newest checkpoint with no step lost or counted twice. Simulated on one machine: one ``torchrun`` per node."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest
from nodes import (
    SMALL,
    SUPPORT,
    TRAIN,
    finish,
    free_port,
    node,
    node_environment,
    said,
    wait_for_step,
    workers,
)
from trace_files import run_traces

LONG = ["trainer.max_steps=200", "save_every=2"]
RUN = Path("runs") / "grpo-bridges_test_dense_env"


def assert_gone(pids: list[int]) -> None:
    alive = [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"processes outlived the run: {alive}"


@pytest.mark.slow
def test_a_killed_process_is_named_by_the_other_machine_within_seconds(tmp_path: Path):
    port = free_port()
    nodes = [node(rank, port, tmp_path, *LONG) for rank in (0, 1)]
    wait_for_step(tmp_path / RUN, 3, nodes)
    victim = workers(nodes[1])[0]
    survivors = workers(nodes[0])
    victim.kill()
    killed = time.monotonic()
    code, err = finish(nodes[0], timeout=60)
    assert time.monotonic() - killed < 30  # gloo saw the socket close; the beats said which process stopped
    assert code != 0
    assert said(err) == [said(err)[0]] and said(err)[0].startswith(
        f"error: training process 1 of 2 on {victim_host()} (pid {victim.pid}) stopped answering while ")
    assert "Connection reset by peer" not in err and "[rank0]: Traceback" not in err
    assert f"traceback : {said(err)[0].removeprefix('error: ')}" in err  # torchrun's block quotes the sentence
    finish(nodes[1], timeout=60)
    assert_gone([p.pid for p in survivors])


@pytest.mark.slow
def test_a_stopped_process_is_named_after_peer_timeout_s(tmp_path: Path):
    port = free_port()
    nodes = [node(rank, port, tmp_path, *LONG, "trainer.peer_timeout_s=5") for rank in (0, 1)]
    wait_for_step(tmp_path / RUN, 3, nodes)
    victim = workers(nodes[1])[0]
    victim.suspend()  # SIGSTOP: its socket stays open, so no collective ever fails
    stopped = time.monotonic()
    try:
        code, err = finish(nodes[0], timeout=90)
        waited = time.monotonic() - stopped
    finally:
        victim.resume()
    assert 5 <= waited < 30 and code != 0
    assert said(err)[0].startswith(f"error: training process 1 of 2 on {victim_host()} (pid {victim.pid}) stopped "
                                   "answering while ") and " s without a beat: killed, hung or its machine gone)" in err
    code, _ = finish(nodes[1], timeout=60)  # resumed, it finds its peers gone and ends too
    assert code != 0
    assert_gone([victim.pid])


@pytest.mark.slow
def test_a_process_that_fails_is_quoted_by_the_others(tmp_path: Path):
    port = free_port()
    program = [str(SUPPORT / "rank_fault.py"), "1", "3"]
    nodes = [node(rank, port, tmp_path, *LONG, program=program) for rank in (0, 1)]
    code, err = finish(nodes[0], timeout=120)
    assert code != 0
    assert said(err) == [said(err)[0]]
    assert said(err)[0].startswith("error: training process 1 of 2 on ") and said(err)[0].endswith(
        "failed while training step 3: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB; the other "
        "processes stopped too, and resume=true continues from the newest checkpoint.")
    code, err = finish(nodes[1], timeout=60)
    assert code != 0 and "RuntimeError: CUDA out of memory" in err  # the failing process's own traceback


@pytest.mark.slow
def test_max_restarts_resumes_from_the_newest_checkpoint_with_every_step_once(tmp_path: Path):
    """One torchrun restarting its whole worker group (across machines torchrun needs its c10d rendezvous for
    that: docs/guide/scaling.md)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--max-restarts=1",
               "--master_addr=127.0.0.1", f"--master_port={free_port()}", *TRAIN, *SMALL,
               "trainer.max_steps=12", "save_every=2", "trainer.batch_size=4"]
    launcher = subprocess.Popen(command, cwd=tmp_path, env=node_environment(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    wait_for_step(tmp_path / RUN, 5, [launcher])
    workers(launcher)[1].kill()
    code, output = finish(launcher, timeout=240)
    assert code == 0, output[-3000:]
    assert "resumed from runs/grpo-bridges_test_dense_env/checkpoints/step_0000" in output
    run = tmp_path / RUN
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 13))  # no step lost, none twice
    per_step = Counter(line["provenance"]["step"] for line in run_traces(run))
    assert per_step == {step: 8 for step in range(1, 13)}  # each step's 4 x 2 episodes, once


def victim_host() -> str:
    import socket

    return socket.gethostname()
