"""Two machines, simulated on this one: ``torchrun --nnodes=2`` per node, each node started in its own working
folder, as on a cluster where every node has its own disk. The ranks of one run share one run folder; a node
that cannot see rank 0's is named in one sentence before any step, within seconds, instead of two ranks
resuming from different steps and waiting on each other until gloo's collective timeout (10 minutes)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ENVS = Path(__file__).resolve().parent / "envs"  # bridges_test_dense_env
SMALL = ["progress=false", "trainer.max_steps=2", "trainer.batch_size=2", "trainer.group_size=2",
         "sampling.max_tokens=4", "env=bridges_test_dense_env", "trainer.device=cpu"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def node(rank: int, port: int, cwd: Path, *args: str, per_node: int = 1) -> subprocess.Popen[str]:
    """One node's ``torchrun`` (``per_node`` processes on it), as a user starts each machine."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={rank}",
               f"--nproc_per_node={per_node}", "--master_addr=127.0.0.1", f"--master_port={port}", "-m",
               "bridges.train", *SMALL, *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ENVS), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def both(first: Path, second: Path, *args: str, per_node: int = 1) -> list[tuple[int, str]]:
    port = free_port()
    nodes = [node(0, port, first, *args, per_node=per_node), node(1, port, second, *args, per_node=per_node)]
    return [(p.wait(timeout=300), p.communicate()[1]) for p in nodes]


@pytest.mark.slow
def test_nodes_with_their_own_folders_are_refused_in_one_sentence_within_seconds(tmp_path: Path):
    folders = [tmp_path / "node0", tmp_path / "node1"]
    for folder in folders:
        folder.mkdir()
    started = time.monotonic()
    results = both(*folders)
    assert time.monotonic() - started < 120  # not a collective timeout
    for code, err in results:
        assert code != 0
        said = [line for line in err.splitlines() if line.startswith("error: ")]
        assert said and said[0].startswith("error: rank 1 on ") and "does not see the run folder rank 0 writes" in said[0]
        assert "output_dir must be on a filesystem every node mounts" in said[0]
    assert not list((folders[1] / "runs").rglob(".shared-*")) and not list((folders[0] / "runs").rglob(".shared-*"))


@pytest.mark.slow
def test_nodes_sharing_one_folder_train_and_resume_into_it(tmp_path: Path):
    shared = tmp_path / "shared"
    shared.mkdir()
    for code, err in both(shared, shared, "save_every=1"):
        assert code == 0, err[-2000:]
    for code, err in both(shared, shared, "resume=true", "trainer.max_steps=3"):
        assert code == 0, err[-2000:]
    run = shared / "runs" / "grpo-bridges_test_dense_env"
    steps = [line.split('"step": ')[1].split(",")[0] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == ["1", "2", "3"]  # one run, resumed where both nodes agree it stopped


@pytest.mark.slow
def test_ranks_that_resume_from_different_steps_are_one_sentence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from bridges.runtime.launch import launch

    support = Path(__file__).resolve().parents[1] / "support"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(support), os.environ.get("PYTHONPATH", "")]))
    assert launch("agreement", [str(tmp_path)], 2, tmp_path) == 0
    expected = ("the ranks do not agree on the step the run resumes from (rank 0: (0, 0), rank 1: (4, 16)); "
                "start them again on one run folder.")
    assert [(tmp_path / f"rank{r}.txt").read_text() for r in (0, 1)] == [expected, expected]


@pytest.mark.slow
def test_two_nodes_of_two_processes_with_their_own_folders_name_both_blind_ranks(tmp_path: Path):
    folders = [tmp_path / "node0", tmp_path / "node1"]
    for folder in folders:
        folder.mkdir()
    for code, err in both(*folders, "trainer.batch_size=4", per_node=2):
        said = [line for line in err.splitlines() if line.startswith("error: ")]
        assert code != 0 and said, err[-2000:]
        assert said[0].startswith("error: rank 2 on ") and ", rank 3 on " in said[0]  # node 1's two ranks
        assert "rank 1 on" not in said[0]  # rank 1 shares rank 0's node, so it sees the folder
