"""``trainer.num_processes=N``: this command, started N times as one training job on this machine.

Each copy gets what ``torchrun`` and ``accelerate launch`` give their workers — ``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` (loopback) and a free
``MASTER_PORT`` — and the backend inside joins the process group from them, so a job started by
either of those launchers runs the same code. (Several machines: start each node with ``torchrun``.)

One copy stopping stops the job: when a process exits with an error or is killed, the others are
stopped within seconds (SIGTERM, then SIGKILL), since their next collective would otherwise wait for
the dead one until its timeout; the job ends with one sentence saying which process stopped and how,
and ``resume=true`` continues from the last checkpoint. Each copy runs in its own session, so stopping
it stops what it started, and on Linux it is killed if this launcher dies (``PR_SET_PDEATHSIG``): no
copy outlives the job.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from bridges.runtime.errors import BridgesError

POLL_S = 0.2
STOP_GRACE_S = 5.0
LAUNCH_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class ProcessFailedError(BridgesError):
    """One process of a multi-process job stopped with an error; the others were stopped."""


def launched_size() -> int:
    """How many processes the launcher that started this one started (1: none did)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_main_process() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def restarts_allowed() -> int:
    """``torchrun --max-restarts``: how many times torchrun may start this job's workers again."""
    return int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0"))


def record_for_launcher(sentence: str) -> None:
    """torchrun's failure block quotes a worker's error file (``TORCHELASTIC_ERROR_FILE``) as the root cause:
    the sentence goes there, instead of "To enable traceback see ..."."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if path:
        with contextlib.suppress(OSError):
            extra = {"py_callstack": sentence, "timestamp": str(int(time.time()))}  # the block shows py_callstack
            Path(path).write_text(json.dumps({"message": {"message": sentence, "extraInfo": extra}}))


def accelerate_settings() -> dict[str, str]:
    """What ``accelerate launch --config_file <file>`` told this process through its environment, as the
    bundled trainer's settings: an FSDP config is ``strategy=fsdp``, its mixed precision a ``dtype``,
    a DeepSpeed config ``deepspeed=true`` (refused by the bundled trainer; TRL runs it)."""
    found: dict[str, str] = {}
    if os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true":
        found["strategy"] = "fsdp"
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true":
        found["deepspeed"] = "true"
    precision = {"bf16": "bf16", "fp16": "fp16", "no": "fp32"}.get(os.environ.get("ACCELERATE_MIXED_PRECISION", ""))
    if precision:
        found["dtype"] = precision
    return found


def free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def worker_environment(rank: int, size: int, port: int) -> dict[str, str]:
    """The launcher variables, and (unless set) the machine's cores shared out as intra-op threads, so N
    processes do not each start a thread per core."""
    threads = os.environ.get("OMP_NUM_THREADS") or str(max(1, (os.cpu_count() or 1) // size))
    return {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(size),
            "LOCAL_WORLD_SIZE": str(size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": threads}


def die_with_parent() -> None:
    """In the child before exec: its own session, and SIGTERM when the launcher dies (Linux)."""
    os.setsid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def launch(module: str, argv: Sequence[str], size: int, run_dir: Path) -> int:
    """Run ``python -m <module> <argv>`` as ``size`` processes; 0 when every one finished, else one
    sentence (``ProcessFailedError``) once all are stopped."""
    port = free_port()
    command = [sys.executable, "-m", module, *argv]
    processes = [
        subprocess.Popen(command, env=worker_environment(rank, size, port), preexec_fn=die_with_parent)
        for rank in range(size)
    ]
    try:
        failed = _first_failure(processes)
    finally:
        stop_processes(processes)
    if failed is None:
        return 0
    rank, code = failed
    if code == 2:  # a BridgesError: its sentence is printed above
        how = "ended with the error above"
    else:
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
    raise ProcessFailedError(
        f"training process {rank} of {size} {how}, so the other processes were stopped; the steps finished "
        f"before it are in {run_dir}, and resume=true continues from its last checkpoint."
    )


def _first_failure(processes: list[subprocess.Popen[bytes]]) -> tuple[int, int] | None:
    """Wait until every process exited 0 (None) or one did not (its rank and exit code)."""
    while True:
        codes = [p.poll() for p in processes]
        for rank, code in enumerate(codes):
            if code not in (None, 0):
                return rank, int(code)
        if all(code == 0 for code in codes):
            return None
        time.sleep(POLL_S)


def stop_processes(processes: list[subprocess.Popen[bytes]], grace: float = STOP_GRACE_S) -> None:
    """Every process still running, with everything it started (each leads its own session:
    ``die_with_parent``): SIGTERM, then SIGKILL after ``grace`` seconds; all reaped."""
    running = [p for p in processes if p.poll() is None]
    for process in running:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for process in running:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
