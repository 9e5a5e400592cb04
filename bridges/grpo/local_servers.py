"""``trainer.servers=K``: K ``bridges.serve`` hf servers started by the trainer, one per device.

Each is ``python -m bridges.serve`` in a process of its own session (``die_with_parent``: it goes
when the trainer goes, even on SIGKILL, on Linux), on a free loopback port, with an API key and a
weights key made for this run, so nothing else on the machine can sample from them or change them.
Their output goes to ``<run>/servers/server-<i>.log``. A server that exits before it answers is one
sentence with the last lines of its log.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import httpx2

from bridges.runtime.errors import ConfigError, EngineError
from bridges.runtime.launch import die_with_parent, free_port, stop_processes

READY_TIMEOUT_S = 600.0
STOP_GRACE_S = 10.0


class LocalServers:
    """The processes, their URLs, and the keys the trainer uses with them."""

    def __init__(self, model: str, devices: list[str], log_dir: Path) -> None:
        self.api_key, self.weights_key = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
        log_dir.mkdir(parents=True, exist_ok=True)
        self.logs = [log_dir / f"server-{i}.log" for i in range(len(devices))]
        self.urls: list[str] = []
        self.processes: list[subprocess.Popen[bytes]] = []
        self._files: list[IO[bytes]] = []
        for device, log in zip(devices, self.logs, strict=True):
            port = free_port()
            command = [sys.executable, "-m", "bridges.serve", f"model={model}", "engine=hf", f"device={device}",
                       f"port={port}", f"api_key={self.api_key}", f"weights_key={self.weights_key}",
                       "access_log=false"]
            self._files.append(log.open("wb"))
            self.processes.append(subprocess.Popen(command, stdout=self._files[-1], stderr=subprocess.STDOUT,
                                                   stdin=subprocess.DEVNULL, preexec_fn=die_with_parent))
            self.urls.append(f"http://127.0.0.1:{port}")

    async def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Until every server answers ``/health``; one that exits first, or the deadline, is one sentence."""
        deadline = time.monotonic() + timeout
        waiting = set(range(len(self.urls)))
        async with httpx2.AsyncClient(timeout=2.0) as http:
            while waiting:
                for i in sorted(waiting):
                    if self.processes[i].poll() is not None:
                        raise EngineError(f"inference server {i} exited with code {self.processes[i].returncode} "
                                          f"before it answered: {self.tail(i)}")
                    with contextlib.suppress(httpx2.HTTPError):
                        if (await http.get(f"{self.urls[i]}/health")).status_code == 200:
                            waiting.discard(i)
                if waiting and time.monotonic() > deadline:
                    raise EngineError(f"inference server {min(waiting)} did not answer within {timeout:.0f} s; "
                                      f"see {self.logs[min(waiting)]}.")
                await asyncio.sleep(0.5)

    def tail(self, i: int, lines: int = 3) -> str:
        text = self.logs[i].read_text(errors="replace").strip().splitlines()
        return " | ".join(text[-lines:]) or "(no output)"

    def close(self) -> None:
        """SIGTERM each (with whatever it started), SIGKILL what is left after the grace period, reaped."""
        stop_processes(self.processes, STOP_GRACE_S)
        for file in self._files:
            file.close()


def server_devices(count: int, devices: list[str]) -> list[str]:
    """One device per server: those given, or the CPU for each."""
    if devices and len(devices) != count:
        raise ConfigError(f"trainer.server_devices names {len(devices)} devices for trainer.servers={count}; "
                          "give one per server.")
    return list(devices) or ["cpu"] * count
