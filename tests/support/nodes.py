"""Several machines, simulated on this one: one ``torchrun --nnodes=2`` per node, each started in the working
folder its machine would have (one shared folder, or one per node as on a cluster without a shared disk)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import psutil

ENVS = Path(__file__).resolve().parents[1] / "grpo" / "envs"  # bridges_test_dense_env
SUPPORT = Path(__file__).resolve().parent
SMALL = ["progress=false", "trainer.max_steps=2", "trainer.batch_size=2", "trainer.group_size=2",
         "sampling.max_tokens=4", "env=bridges_test_dense_env", "trainer.device=cpu"]
TRAIN = ["-m", "bridges.train"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def node(rank: int, port: int, cwd: Path, *args: str, per_node: int = 1, program: Sequence[str] = TRAIN,
         launcher: Sequence[str] = ()) -> subprocess.Popen[str]:
    """One node's ``torchrun`` (``per_node`` processes on it), as a user starts each machine: the static
    rendezvous (``--master_addr``), or with ``launcher`` given, its options instead (``--rdzv-backend=c10d``)."""
    where = launcher or ["--master_addr=127.0.0.1", f"--master_port={port}"]
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={rank}",
               f"--nproc_per_node={per_node}", *where, *program, *SMALL, *args]
    return subprocess.Popen(command, cwd=cwd, env=node_environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def node_environment() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join([str(ENVS), str(SUPPORT), os.environ.get("PYTHONPATH", "")])}


def both(first: Path, second: Path, *args: str, per_node: int = 1) -> list[tuple[int, str]]:
    port = free_port()
    nodes = [node(0, port, first, *args, per_node=per_node), node(1, port, second, *args, per_node=per_node)]
    return [(p.wait(timeout=300), p.communicate()[1]) for p in nodes]


def workers(launcher: subprocess.Popen[str]) -> list[psutil.Process]:
    """The training processes one node's torchrun started (waits until they exist)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = [c for c in psutil.Process(launcher.pid).children() if "torch.distributed.run" not in " ".join(c.cmdline())]
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError("torchrun started no worker")


def wait_for_step(run_dir: Path, step: int, launchers: Sequence[subprocess.Popen[str]]) -> None:
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= step):
        assert time.monotonic() < deadline and all(p.poll() is None for p in launchers), "the run did not reach the step"
        time.sleep(0.1)


def finish(launcher: subprocess.Popen[str], timeout: float) -> tuple[int, str]:
    """The launcher's exit code and output (stdout, then stderr); killed (with its workers) and failed if it
    outlives ``timeout``."""
    try:
        out, err = launcher.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for child in psutil.Process(launcher.pid).children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                child.send_signal(signal.SIGKILL)
        launcher.kill()
        raise AssertionError(f"the node did not exit within {timeout} s: {launcher.communicate()[1][-2000:]}") from None
    return launcher.returncode, out + err


def said(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error: ")]
