"""``python -m bridges.serve`` in a subprocess, as a user starts one for ``trainer.server_urls``."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx

from bridges.runtime.launch import free_port

WEIGHTS_KEY = "test-weights-key"


class ServeProcess:
    def __init__(
        self, log: Path, model: str = "tiny", port: int | None = None, weights_key: str = WEIGHTS_KEY
    ) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        command = [sys.executable, "-m", "bridges.serve", f"model={model}", "device=cpu", f"port={self.port}",
                   f"weights_key={weights_key}", "access_log=false"]
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def wait(self, timeout: float = 180.0) -> ServeProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log.read_text()[-2000:]
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise AssertionError(f"bridges.serve did not answer in {timeout} s: {self.log.read_text()[-2000:]}")

    def health(self) -> dict:
        return httpx.get(f"{self.url}/health", timeout=5).json()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
