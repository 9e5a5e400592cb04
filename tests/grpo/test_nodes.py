"""Two machines, simulated on this one: ``torchrun --nnodes=2`` per node, each node started in its own working
folder, as on a cluster where every node has its own disk. The ranks of one run share one run folder; a node
that cannot see rank 0's is named in one sentence before any step, within seconds, instead of two ranks
resuming from different steps and waiting on each other until gloo's collective timeout (10 minutes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from nodes import SMALL, both, finish, free_port, node_environment
from trace_files import run_traces


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


@pytest.mark.slow
def test_two_nodes_of_two_processes_save_and_resume_into_one_folder(tmp_path: Path):
    shared = tmp_path / "shared"
    shared.mkdir()
    for code, err in both(shared, shared, "save_every=1", "trainer.batch_size=4", per_node=2):
        assert code == 0, err[-2000:]
    for code, err in both(shared, shared, "resume=true", "trainer.max_steps=3", "trainer.batch_size=4", per_node=2):
        assert code == 0, err[-2000:]
    run = shared / "runs" / "grpo-bridges_test_dense_env"
    assert [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())] == [1, 2, 3]
    per_step = Counter(line["provenance"]["step"] for line in run_traces(run))
    assert per_step == {1: 8, 2: 8, 3: 8}  # every rank's episodes in the one traces file, each step once


@pytest.mark.slow
def test_accelerate_launch_on_two_machines_trains_one_run(tmp_path: Path):
    port = free_port()
    nodes = [subprocess.Popen(
        [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_machines=2", f"--machine_rank={rank}",
         "--main_process_ip=127.0.0.1", f"--main_process_port={port}", "--num_processes=2", "--mixed_precision=no",
         "--dynamo_backend=no", "-m", "bridges.train", *SMALL],
        cwd=tmp_path, env=node_environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for rank in (0, 1)]
    for launcher in nodes:
        code, output = finish(launcher, timeout=300)
        assert code == 0, output[-2000:]
    rows = (tmp_path / "runs" / "grpo-bridges_test_dense_env" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["step"] for r in rows] == [1, 2]
