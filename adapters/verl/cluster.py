"""verl on a Ray cluster that is already running (``RAY_ADDRESS``): every node is checked before verl starts.

Why: verl's workers import our plugin on whichever node Ray places them. On a node where rl-bridges
cannot be imported, verl fails deep inside a worker, minutes in, with a stack trace from its own
code. One small task per node, pinned there and run with the job's runtime environment, finds that
first and says which node in one sentence.

After the run, the episodes: verl's agent-loop workers write traces to the run folder's path on their
own node's disk. ``gather_traces`` brings every other node's file into the driver's
``traces.jsonl.gz`` (and removes it there), so the run folder stays the one record of the run; where
the nodes share the folder (one machine, a network file system) there is nothing to bring.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator, Sequence
from typing import Any

from bridges.adapters.verl.placement import NodeResources
from bridges.runtime.errors import ConfigError, require_extra

NEEDED = ("bridges.adapters.verl.plugin", "verl")
CHECK_TIMEOUT_S = 120.0


def _importable(modules: Sequence[str]) -> str | None:
    """Run on a node: None when every module can be found there, else which cannot."""
    import importlib.util

    for module in modules:
        try:
            if importlib.util.find_spec(module) is None:
                return f"cannot import {module}"
        except (ImportError, ValueError) as exc:
            return f"cannot import {module} ({type(exc).__name__}: {exc})"
    return None


@contextlib.contextmanager
def _joined(env: dict[str, str]) -> Iterator[Any]:
    """This process joined to the cluster at ``RAY_ADDRESS`` with the job's runtime environment ``env``,
    left again afterwards; an address that answers nothing or cannot be joined is one sentence."""
    ray = require_extra("ray", "verl", "backend=verl on a Ray cluster")
    address = os.environ["RAY_ADDRESS"]
    _reachable(address)
    try:
        ray.init(address=address, runtime_env={"env_vars": env}, log_to_driver=False, logging_level="ERROR")
    except Exception as exc:  # a wrong address, a cluster that is gone, an auth mismatch
        raise ConfigError(f"RAY_ADDRESS={address} names no Ray cluster this process can join "
                          f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]}).") from None
    try:
        yield ray
    finally:
        ray.shutdown()


def _on_each_node(ray: Any, function: Any, *args: Any) -> list[tuple[dict[str, Any], Any]]:
    """``function(*args)`` as a task pinned to each alive node: (the node, the task's reference)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0)(function)
    return [(node, task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False))
             .remote(*args)) for node in ray.nodes() if node.get("Alive")]


def check_nodes(
    env: dict[str, str], modules: Sequence[str] = NEEDED, timeout: float = CHECK_TIMEOUT_S
) -> list[NodeResources]:
    """Every alive node of the cluster at ``RAY_ADDRESS`` imports ``modules`` under ``env`` (the job's
    runtime environment), or ``ConfigError`` naming the first that does not. Returns the CPUs and GPUs
    each node declares (what verl's resource pool will count: ``placement.gpu_layout`` and
    ``placement.check_cluster_fits`` read them)."""
    with _joined(env) as ray:
        pending = _on_each_node(ray, _importable, modules)
        for node, ref in pending:
            missing, failed = _answer(ray, ref, timeout)
            problem = failed or missing
            if problem is not None:
                raise ConfigError(
                    f"Ray node {node['NodeManagerAddress']} ({node['NodeID'][:12]}) {problem}: install rl-bridges "
                    "and verl on every node of the cluster (the same versions), or put the project on a path "
                    "every node shares and in PYTHONPATH."
                )
        return [NodeResources(str(node["NodeManagerAddress"]), float(node.get("Resources", {}).get("CPU", 0)),
                              int(node.get("Resources", {}).get("GPU", 0))) for node, _ in pending]


def _reachable(address: str) -> None:
    """A ``host:port`` that takes no TCP connection is one sentence now, not Ray's minute of retries."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or "://" in address:  # "auto", ray://...: left to Ray
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5.0).close()
    except OSError as exc:
        raise ConfigError(f"RAY_ADDRESS={address}: nothing answers there ({exc.strerror or exc}); start the "
                          "cluster with ray start --head, or unset RAY_ADDRESS to let verl start its own.") from None


def _answer(ray: Any, ref: Any, timeout: float) -> tuple[Any, str | None]:
    """(what a node's task returned, None), or (None, why it gave nothing) in a few words."""
    try:
        return ray.get(ref, timeout=timeout), None
    except ray.exceptions.GetTimeoutError:
        return None, f"did not run its task within {timeout:.0f} s"
    except Exception as exc:  # the task's process could not start (a runtime environment that fails there)
        return None, f"could not run its task ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})"


def _take_remote_traces(run_dir: str, token: str) -> bytes | None:
    """Run on a node after the run: the traces verl's workers wrote to this node's disk, removed from it;
    None where the run folder is the driver's own (a shared file system: the driver's token is there)."""
    from pathlib import Path

    from bridges.workflows.traces import TRACES_FILE

    folder = Path(run_dir)
    if (folder / token).exists():
        return None
    traces = folder / TRACES_FILE
    if not traces.exists():
        return b""
    data = traces.read_bytes()  # whole gzip members: appended as they are, they stay one gzip file
    traces.unlink()
    return data


def gather_traces(run_dir: Any, env: dict[str, str], timeout: float = CHECK_TIMEOUT_S) -> int:
    """Append to the driver's ``traces.jsonl.gz`` the episodes workers on other nodes wrote to their own
    disks (verl places agent-loop workers anywhere); returns how many were brought over. A node (or a
    cluster) that does not answer costs one line on stderr: its file stays where it is, and the run's
    outcome is its training's."""
    import secrets
    import sys

    token = f".gather-{secrets.token_hex(8)}"
    (run_dir / token).touch()
    import gzip
    import io

    from bridges.workflows.traces import TRACES_FILE, gzip_member_lines

    texts: list[bytes] = []
    try:
        with _joined(env) as ray:
            for node, ref in _on_each_node(ray, _take_remote_traces, str(run_dir), token):
                text, problem = _answer(ray, ref, timeout)
                if problem is not None:
                    print(f"the traces of Ray node {node['NodeManagerAddress']} were not brought over (it {problem}); "
                          f"they stay in {run_dir / TRACES_FILE} on that node.", file=sys.stderr, flush=True)
                elif text:
                    texts.append(text)
    except ConfigError as exc:
        print(f"the traces of other Ray nodes were not brought over: {exc}", file=sys.stderr, flush=True)
    finally:
        (run_dir / token).unlink()
    brought = 0
    with (run_dir / TRACES_FILE).open("ab") as out:
        for data in texts:  # whole members only: one a kill cut on that node is not brought
            lines = list(gzip_member_lines(io.BytesIO(data), f"the traces of another node for {run_dir}"))
            if lines:
                out.write(gzip.compress(b"".join(lines), compresslevel=6))
            brought += len(lines)
    return brought
