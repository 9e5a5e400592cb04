"""verl on a Ray cluster started before the run (issue 27, item 5): a head and a second raylet on this
machine (``ray start``), ``RAY_ADDRESS`` set, ``backend=verl`` for two steps. Every verl process that
loads our plugin leaves a mark naming its Ray node (``BRIDGES_VERL_MARKS``, carried to the workers by
the job's runtime environment like the plugin itself): both raylets' workers must have loaded it.
A node that cannot import the project, and an address where no cluster answers, are one sentence.
Both raylets are stopped afterwards, by a mark in their environment (``ray stop`` would stop every
cluster on the machine, other tests' included)."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from local_ray import start_local_ray  # noqa: E402
from process_marks import processes_marked  # noqa: E402
from trace_files import run_traces

from bridges.runtime.launch import free_port  # noqa: E402

pytest.importorskip("verl")
pytestmark = pytest.mark.usefixtures("ray_alone")  # every test here starts or joins a Ray cluster
SMALL = ["backend=verl", "trainer.max_steps=2", "trainer.batch_size=2", "trainer.group_size=4", "sampling.max_tokens=8",
         "progress=false", "env=bridges_test_dense_env",  # a reward every group spreads on: one that trains nothing is an error
         "verl.trainer.device=cpu"]  # a CPU cluster says so: its GPU resource is logical (last: SMALL[:-1] drops it)
ENVS = str(Path(__file__).parents[1] / "grpo" / "envs")  # where every raylet's workers import it from


# Ray gives its GCS ~20 s to answer a starting head; two heads starting at once on a loaded 2-core
# machine (both pytest workers) have missed that. Ray's own operator budget for the wait, in seconds.
GCS_WAIT = {"RAY_gcs_server_port_wait_time_s": "120"}


@pytest.fixture(autouse=True)
def _patient_gcs(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in GCS_WAIT.items():
        monkeypatch.setenv(key, value)


def ray_command(*args: str) -> list[str]:
    return [str(Path(sys.executable).parent / "ray"), *args]


@contextlib.contextmanager
def two_raylets(head_gpus: int, worker_gpus: int) -> Iterator[dict[str, str]]:
    """A head (3 CPUs) and a second raylet (2 CPUs) declaring these GPU resources, each with its own temp
    folder (short: Ray's socket paths have a length limit); the environment to join them."""
    mark = f"BRIDGES_TEST_CLUSTER={uuid.uuid4().hex}"
    root = Path(tempfile.mkdtemp(prefix="rb", dir="/tmp"))
    port = free_port()
    env = {**os.environ, **GCS_WAIT, "RAY_AUTH_MODE": "disabled", mark.split("=")[0]: mark.split("=")[1],
           "PYTHONPATH": ENVS}
    common = ["--node-ip-address", "127.0.0.1", "--disable-usage-stats"]
    try:
        subprocess.run(ray_command("start", "--head", "--port", str(port), "--num-cpus", "3", "--num-gpus", str(head_gpus),
                                   "--include-dashboard=false", "--temp-dir", str(root / "head"), *common),
                       env=env, check=True, capture_output=True, timeout=180)
        subprocess.run(ray_command("start", "--address", f"127.0.0.1:{port}", "--num-cpus", "2",
                                   "--num-gpus", str(worker_gpus), "--temp-dir", str(root / "worker"), *common),
                       env=env, check=True, capture_output=True, timeout=180)
        yield {**env, "RAY_ADDRESS": f"127.0.0.1:{port}"}
    finally:
        for pid in processes_marked(mark):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while processes_marked(mark) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not processes_marked(mark)  # both raylets and every worker they started are gone


@pytest.fixture
def cluster() -> Iterator[dict[str, str]]:
    """A CPU cluster for verl: the head declares one logical GPU (verl's resource pool counts GPUs)."""
    with two_raylets(head_gpus=1, worker_gpus=0) as env:
        yield env


@pytest.mark.slow
def test_verl_on_a_two_raylet_cluster_loads_the_plugin_on_both(cluster: dict[str, str], tmp_path: Path):
    marks = tmp_path / "marks"
    job = subprocess.run([sys.executable, "-m", "bridges.train", *SMALL], cwd=tmp_path, capture_output=True,
                         text=True, timeout=900, env={**cluster, "BRIDGES_VERL_MARKS": str(marks)})
    assert job.returncode == 0, job.stderr[-3000:]
    loaded = [p.name.rsplit("-", 1)[0] for p in marks.iterdir()]
    nodes = {n for n in loaded if n != "driver"}
    assert len(nodes) == 2, loaded  # workers on the head and on the second raylet loaded it
    assert {p.read_text() for p in marks.iterdir()} == {"1"}  # BRIDGES_VERL_CPU reached each of them
    run = tmp_path / "runs" / "verl-bridges_test_dense_env"
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    traces = run_traces(run)
    assert sum(t["provenance"]["split"] == "train" for t in traces) == 2 * 2 * 4


def test_a_node_without_the_project_or_a_dead_address_is_one_sentence(cluster: dict[str, str], monkeypatch):
    from bridges.adapters.verl.cluster import check_nodes
    from bridges.runtime.errors import ConfigError

    for key in ("RAY_ADDRESS", "RAY_AUTH_MODE"):
        monkeypatch.setenv(key, cluster[key])
    nodes = sorted(check_nodes({}), key=lambda node: -node.cpus)
    assert [(n.cpus, n.gpus) for n in nodes] == [(3.0, 1), (2.0, 0)]  # the head's logical GPU, the worker's none
    with pytest.raises(ConfigError, match=r"^Ray node \S+ \(\w+\) cannot import missing_here: install rl-bridges"):
        check_nodes({}, modules=("bridges", "missing_here"))
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{free_port()}")
    with pytest.raises(ConfigError, match=r"nothing answers there"):
        check_nodes({})


def test_a_cluster_verl_cannot_place_on_is_one_sentence():
    """No GPU resource anywhere (verl: "Total available GPUs 0 ..."), or too few CPUs beside the GPUs
    (verl: waits with no end); a cluster that holds the reservation passes."""
    from bridges.adapters.verl.placement import GpuLayout, NodeResources, check_cluster_fits
    from bridges.runtime.errors import ConfigError

    cpu_mode, two_gpus = GpuLayout(0, 1, "test"), GpuLayout(2, 2, "test")
    with pytest.raises(ConfigError, match=r"1 logical GPU \(CPU mode counts one\) and 3 CPUs .*--num-gpus=1"):
        check_cluster_fits(cpu_mode, [NodeResources("10.0.0.1", 8, 0)])
    with pytest.raises(ConfigError, match=r"2 Ray node\(s\) with 2 GPU\(s\) and 6 CPUs each .* 10.0.0.2 4 CPU \+ 2 GPU"):
        check_cluster_fits(two_gpus, [NodeResources("10.0.0.1", 16, 2), NodeResources("10.0.0.2", 4, 2)])
    check_cluster_fits(two_gpus, [NodeResources("10.0.0.1", 16, 2), NodeResources("10.0.0.2", 6, 4)])
    check_cluster_fits(cpu_mode, [NodeResources("10.0.0.1", 3, 1)])


def test_traces_a_node_does_not_hand_over_cost_one_line_not_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    """Before: Ray's GetTimeoutError ended the run after training. Now: one line, and the file stays."""
    import ray

    from bridges.adapters.verl import cluster

    start_local_ray(num_cpus=1)
    try:
        @contextlib.contextmanager
        def joined(env: dict[str, str]) -> Iterator[object]:
            yield ray

        def never_answers(run_dir: str, token: str) -> bytes:
            time.sleep(30)
            return b""

        monkeypatch.setattr(cluster, "_joined", joined)
        monkeypatch.setattr(cluster, "_take_remote_traces", never_answers)
        (tmp_path / "traces.jsonl.gz").write_bytes(gzip.compress(b'{"a": 1}\n'))
        assert cluster.gather_traces(tmp_path, {}, timeout=1.0) == 0
    finally:
        ray.shutdown()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "were not brought over (it did not run its task within 1 s)" in err[0], err
    assert gzip.decompress((tmp_path / "traces.jsonl.gz").read_bytes()) == b'{"a": 1}\n'
    assert not list(tmp_path.glob(".gather-*"))


def test_a_nodes_own_traces_are_taken_unless_it_shares_the_drivers_folder(tmp_path: Path):
    from bridges.adapters.verl.cluster import _take_remote_traces

    members = gzip.compress(b'{"a": 1}\n') + gzip.compress(b'{"a": 2}\n')  # two writes, two members
    (tmp_path / "traces.jsonl.gz").write_bytes(members)
    (tmp_path / ".gather-x").touch()
    assert _take_remote_traces(str(tmp_path), ".gather-x") is None  # the driver's own folder: left alone
    assert (tmp_path / "traces.jsonl.gz").exists()
    assert _take_remote_traces(str(tmp_path), ".gather-y") == members  # another node's disk, as written
    assert not (tmp_path / "traces.jsonl.gz").exists()
    assert _take_remote_traces(str(tmp_path / "none"), ".gather-y") == b""


def test_gpus_are_counted_on_the_cluster_not_on_a_head_without_any(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The driver runs on a head with no GPU resource and the second raylet declares one: verl gets one
    GPU on one node, not CPU mode, and a stale BRIDGES_VERL_CPU in the shell does not travel."""
    from bridges.adapters.verl.cluster import check_nodes
    from bridges.adapters.verl.launch import prepare
    from bridges.adapters.verl.placement import check_cluster_fits, gpu_layout
    from bridges.runs.config import parse_config
    from bridges.runs.train_config import TrainConfig
    from bridges.runtime.errors import ConfigError

    with two_raylets(head_gpus=0, worker_gpus=1) as env:
        for key in ("RAY_ADDRESS", "RAY_AUTH_MODE"):
            monkeypatch.setenv(key, env[key])
        monkeypatch.setenv("BRIDGES_VERL_CPU", "1")
        nodes = check_nodes({})
    gpus = [node.gpus for node in nodes]
    assert sorted(gpus) == [0, 1]
    config = parse_config(TrainConfig, [*SMALL[:-1], f"output_dir={tmp_path}", "engine=hf"])
    # the GPU node has 2 CPUs and verl reserves 3 beside its GPU: before, verl waited with no end
    with pytest.raises(ConfigError, match=r"^verl will reserve 1 Ray node\(s\) with 1 GPU\(s\) and 3 CPUs each .* "
                                          r"start each with ray start --num-cpus=3 --num-gpus=1"):
        check_cluster_fits(gpu_layout(config, gpus), nodes)
    command, _, variables = prepare(config, gpus)
    keys = dict(arg.split("=", 1) for arg in command[3:])
    assert keys["trainer.n_gpus_per_node"] == "1" and keys["trainer.nnodes"] == "1"
    assert "trainer.device" not in keys and "BRIDGES_VERL_CPU" not in variables
    assert not any("BRIDGES_VERL_CPU" in key for key in keys)  # nor in the job's runtime environment
