"""The bundled trainer on ``bridges.serve`` servers in subprocesses (issue 27, items 2-4): it learns the
default task, every trained sample is within ``num_batches_ahead`` weight versions of its step, the
servers' logprobs are the trainer's after every push (the importance ratio is 1 on-policy), a server
killed mid-run is taken out and re-admitted when it comes back, and a mismatched or locked server
stops the run in one sentence before any step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from serve_process import WEIGHTS_KEY, ServeProcess  # noqa: E402
from trace_files import run_traces

RUN = Path("runs") / "grpo-repeat_letter"


def train(cwd: Path, *args: str, key: str = WEIGHTS_KEY) -> subprocess.Popen[str]:
    env = {**os.environ, "BRIDGES_SERVER_WEIGHTS_KEY": key}
    return subprocess.Popen([sys.executable, "-m", "bridges.train", "progress=false", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def staleness(traces: list[dict[str, Any]], metrics: list[dict[str, Any]]) -> list[int]:
    """Per episode: the trainer's weight version when it trained on it (after the previous step's push;
    1, the first push, for step 1) minus the oldest version it was sampled under (its provenance)."""
    trained_under = {1: 1} | {row["step"] + 1: row["weight_version"] for row in metrics}
    return [trained_under[t["provenance"]["step"]] - t["provenance"]["weight_version"] for t in traces]


@pytest.mark.slow
def test_one_process_on_two_started_servers_learns_within_the_staleness_bound(tmp_path: Path):
    job = train(tmp_path, "trainer.inference=server", "trainer.servers=2", "trainer.max_steps=40")
    out, err = job.communicate(timeout=900)
    assert job.returncode == 0, err[-3000:]
    metrics = lines(tmp_path / RUN / "metrics.jsonl")
    rewards = [row["reward/mean"] for row in metrics]
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    assert last > max(0.03, 2 * first), (first, last)  # in-process, the same 40 steps: 0.01 -> about 0.05
    traces = run_traces(tmp_path / RUN)
    assert len(traces) == 40 * 256 and all(t["provenance"]["engine"] == "server" for t in traces)
    lag = Counter(staleness(traces, metrics))
    assert set(lag) <= {0, 1} and lag[1] > 0  # num_batches_ahead=1: one version behind, never more
    assert sorted(p.name for p in (tmp_path / RUN / "servers").iterdir()) == ["server-0.log", "server-1.log"]


@pytest.mark.slow
def test_two_processes_on_two_servers_sample_exactly_what_they_train(tmp_path: Path):
    servers = [ServeProcess(tmp_path / f"s{i}.log") for i in range(2)]
    try:
        for server in servers:
            server.wait()
        urls = ",".join(s.url for s in servers)
        job = train(tmp_path, "trainer.inference=server", f"trainer.server_urls=[{urls}]", "trainer.num_processes=2",
                    "trainer.num_batches_ahead=0", "trainer.max_steps=6", "trainer.batch_size=8", "trainer.group_size=8")
        out, err = job.communicate(timeout=600)
        assert job.returncode == 0, err[-3000:]
        metrics = lines(tmp_path / RUN / "metrics.jsonl")
        # on-policy: the server sampled under the weights the trainer computes with, so the ratio is 1
        assert all(abs(row["ratio/mean"] - 1.0) < 1e-4 and row["clip_fraction"] == 0.0 for row in metrics), (
            metrics
        )
        traces = run_traces(tmp_path / RUN)
        assert len(traces) == 6 * 64 and set(staleness(traces, metrics)) == {0}
        assert all(t["error"] is None for t in traces)
        final = metrics[-1]["weight_version"]
        assert [s.health()["weight_version"] for s in servers] == [final, final]
    finally:
        for server in servers:
            server.kill()


@pytest.mark.slow
def test_a_server_killed_mid_run_is_taken_out_and_readmitted_when_it_returns(tmp_path: Path):
    servers = [ServeProcess(tmp_path / f"s{i}.log").wait() for i in range(2)]
    urls = ",".join(s.url for s in servers)
    # the pushes go over gloo pairs: the killed server's pair breaks, the fresh process joins a new one
    job = train(tmp_path, "trainer.inference=server", f"trainer.server_urls=[{urls}]", "trainer.max_steps=60",
                "trainer.batch_size=4", "trainer.group_size=4", "save_every=0", "trainer.weight_channel=gloo")
    try:
        metrics = tmp_path / RUN / "metrics.jsonl"
        deadline = time.monotonic() + 300
        while not metrics.exists() or len(lines(metrics)) < 3:
            assert job.poll() is None and time.monotonic() < deadline, job.communicate()[1][-3000:]
            time.sleep(0.1)
        servers[1].kill()
        killed_at = len(lines(metrics))
        servers[1] = ServeProcess(
            tmp_path / "s1.log", port=servers[1].port
        )  # the same address, a fresh process
        out, err = job.communicate(timeout=600)
    finally:
        if job.poll() is None:
            job.kill()
        for server in servers:
            server.kill()
    assert job.returncode == 0, err[-3000:]
    assert (
        "weights reach the 2 inference servers over gloo" in out
        and f"inference server {servers[1].url} is out" in out
        and f"inference server {servers[1].url} is back in" in out
    )
    traces = run_traces(tmp_path / RUN)
    trained = [t for t in traces if t["error"] is None]
    masked = [t["error"] for t in traces if t["error"] is not None]
    assert len(traces) == 60 * 16 and set(staleness(trained, lines(metrics))) <= {0, 1}, masked[:3]
    # at most the rollouts on it when it died, and any the fresh process answered before it had the weights
    assert len(masked) <= 2 * 16, masked[:3]
    assert all("older than the" in e or "model call failed" in e or "server" in e for e in masked), masked[:3]
    assert killed_at < 60


def test_a_server_with_another_model_or_without_the_key_stops_the_run_in_one_sentence(tmp_path: Path):
    other = ServeProcess(tmp_path / "other.log", model="tiny-qwen2.5")
    same = ServeProcess(tmp_path / "same.log")
    try:
        other.wait(), same.wait()
        for url, key, words in (
            (other.url, WEIGHTS_KEY, "it serves another model"),
            (
                same.url,
                "wrong-key",
                "did not take the trainer's weights: the weight push failed (401: missing or wrong",
            ),
        ):
            job = train(
                tmp_path,
                "trainer.inference=server",
                f"trainer.server_urls=[{url}]",
                "trainer.max_steps=1",
                key=key,
            )
            out, err = job.communicate(timeout=300)
            assert job.returncode == 2 and err.strip().splitlines()[-1].startswith(
                f"error: inference server {url}"
            ), err
            assert words in err and "Traceback" not in err
        assert same.health()["weight_version"] == 0  # the refused push changed nothing
    finally:
        other.kill(), same.kill()


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["trainer.inference=server"], "needs exactly one of trainer.server_urls"),
        (["trainer.servers=2"], "read only with trainer.inference=server"),
        (["trainer.inference=server", "trainer.server_urls=[ftp://x:1]"], "is not http(s)://host:port"),
        (
            ["trainer.inference=server", "trainer.servers=2", "trainer.server_devices=[cpu]"],
            "give one per server",
        ),
        (["trainer.inference=server", "trainer.servers=1", "trainer.rollout_process=true"], "do not combine"),
    ],
)
def test_server_settings_that_cannot_work_are_one_sentence(
    tmp_path: Path, args: list[str], words: str, capsys: pytest.CaptureFixture[str], monkeypatch
):
    from bridges.runs.config import run_cli
    from bridges.train import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        run_cli(main, args)
    assert exit_.value.code == 2 and words in capsys.readouterr().err.strip().splitlines()[-1]
    assert not (tmp_path / "runs").exists()
