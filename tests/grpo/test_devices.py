"""Every tensor the trainer, the hf engine and the logprob step create names its device, and device and
precision settings are checked in one sentence before anything loads."""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from bridges.runs.config import run_cli

ROOT = Path(__file__).resolve().parents[2]
# the code that builds tensors for a model on trainer.device: one created on the default (CPU) device
# would be a silent host-to-device copy per step on a GPU, or a device mismatch error
CHECKED = [*sorted((ROOT / "bridges" / "grpo").glob("*.py")), *sorted((ROOT / "adapters" / "hf").glob("*.py")),
           ROOT / "bridges" / "models" / "token_logprobs.py", ROOT / "adapters" / "tinker" / "local_model.py"]
FACTORIES = {"tensor", "zeros", "ones", "full", "empty", "arange", "rand", "randn", "randint", "linspace", "eye",
             "as_tensor", "Generator"}


def flagged_calls(path: Path, describe: Callable[[ast.Call], str | None]) -> list[str]:
    """``path:line what`` for every call in ``path`` that ``describe`` names (None: not flagged)."""
    return [f"{path.relative_to(ROOT)}:{node.lineno} {what}" for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call) and (what := describe(node)) is not None]


def _factory_without_device(node: ast.Call) -> str | None:
    func = node.func
    if (
        isinstance(func, ast.Attribute) and func.attr in FACTORIES and isinstance(func.value, ast.Name)
        and func.value.id == "torch" and not any(k.arg == "device" for k in node.keywords)
    ):
        return f"torch.{func.attr}(...)"
    return None


@pytest.mark.parametrize(
    ("argv", "piece"),
    [
        (["trainer.device=cuda"], "trainer.device=cuda but no CUDA device is visible here; use trainer.device=auto"),
        (["trainer.device=gpu"], "trainer.device=gpu is not a device; use auto"),
        (["trainer.device=cuda:x"], "trainer.device=cuda:x is not a device"),
        (["trainer.dtype=int8"], "trainer.dtype must be one of auto, bf16, fp16, fp32; got 'int8'"),
        (["trainer.num_processes=3"], "trainer.batch_size=16 does not divide among 3 processes"),
        (["trainer.num_processes=2", "trainer.rollout_process=true"], "do not combine"),
        (["trainer.strategy=zero9"], "trainer.strategy must be one of ddp, fsdp; got 'zero9'"),
        (["backend=tinker", "tinker.base_url=local", "trainer.dtype=bf16"], "backend=tinker does not use trainer.dtype"),
    ],
)
def test_bad_device_precision_and_process_settings_are_one_sentence(argv, piece, capsys):
    from bridges.train import main

    with pytest.raises(SystemExit) as exit_info:
        run_cli(main, argv)
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and piece in err and len(err.splitlines()) == 1, err
    assert not Path("runs").exists()


# --------------------------------------------------------------------------------------------------
# One device per rank in every thread: CUDA's current device is per thread (a new thread is on cuda:0)

THREADED = [*sorted((ROOT / "bridges" / "grpo").glob("*.py")), *sorted((ROOT / "adapters" / "hf").glob("*.py")),
            ROOT / "workflows" / "run_loop.py"]
# worker-thread calls that touch no GPU: a child process's join, an HTTP body's bytes, the whole model's
# payload for a server that fell behind (host copies of tensors that name their device)
UNBOUND_ALLOWED = {"self._process.join", "encode", "self._whole_parts", "reducer.barrier"}


def _unbound_thread_entry(node: ast.Call) -> str | None:
    if not (isinstance(node.func, ast.Attribute) and node.func.attr == "to_thread" and node.args):
        return None
    entry = node.args[0]
    if isinstance(entry, ast.Call) and ast.unparse(entry.func) == "bound":
        return None
    return None if ast.unparse(entry) in UNBOUND_ALLOWED else ast.unparse(entry)


# what each scan checks, over which files, and a snippet it must flag exactly once
SCANS = {
    "device": (CHECKED, _factory_without_device, "tensors created without device=",
               "import torch\nx = torch.zeros(3, dtype=torch.long)\ny = torch.ones(2, device=d)\n",
               "bad.py:2 torch.zeros(...)"),
    "thread": (THREADED, _unbound_thread_entry, "asyncio.to_thread without bound(device, ...)",
               "async def f():\n    await asyncio.to_thread(train_step, 1)\n"
               "    await asyncio.to_thread(bound(d, train_step), 1)\n", "bad.py:2 train_step"),
}


@pytest.mark.parametrize("scan", sorted(SCANS))
def test_the_trainer_and_the_hf_engine_pass_the_scan(scan: str):
    """device: every tensor they create names its device; thread: every worker thread binds its device first."""
    paths, describe, problem, _, _ = SCANS[scan]
    missing = [line for path in paths for line in flagged_calls(path, describe)]
    assert not missing, f"{problem}:\n" + "\n".join(missing)


@pytest.mark.parametrize("scan", sorted(SCANS))
def test_the_scan_finds_what_it_looks_for(scan: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    _, describe, _, code, expected = SCANS[scan]
    (tmp_path / "bad.py").write_text(code)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert flagged_calls(tmp_path / "bad.py", describe) == [expected]


def test_a_real_run_binds_every_worker_thread_to_the_trainers_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Each thread entry clears the thread's binding first, so only a call that binds itself passes:
    training, the gathers before a push, saves, barriers and the hf engine's batches and updates."""
    import asyncio

    import torch

    from bridges.grpo.trainer import run
    from bridges.models import hardware
    from bridges.runs.config import parse_config
    from bridges.runs.train_config import TrainConfig

    real, seen = asyncio.to_thread, []

    async def checking(func, /, *args, **kwargs):  # type: ignore[no-untyped-def]
        def entry():  # type: ignore[no-untyped-def]
            hardware._thread.device = None
            try:
                return func(*args, **kwargs)
            finally:
                inner = getattr(func, "__wrapped__", func)
                seen.append((getattr(inner, "__name__", None) or repr(inner), hardware.thread_device()))

        return await real(entry)

    monkeypatch.setattr(asyncio, "to_thread", checking)
    config = parse_config(TrainConfig, [f"output_dir={tmp_path}", "progress=false", "trainer.device=cpu",
                                        "trainer.max_steps=2", "save_every=1", "trainer.batch_size=2",
                                        "trainer.group_size=2", "env=bridges_test_dense_env"])
    assert run(config) == 0
    names = {name for name, _ in seen}
    assert {"train_step", "full_state_dict", "save_checkpoint", "_run_batch"} <= names, names
    assert any("barrier" in name for name in names), names
    unbound = [name for name, device in seen if device != torch.device("cpu")]
    assert not unbound, unbound


def test_the_process_group_is_bound_to_the_ranks_gpu(monkeypatch: pytest.MonkeyPatch):
    """On CUDA the group is made with device_id (NCCL binds to the rank's GPU; barriers and collectives
    never fall back to cuda:0) and the main thread's current device is that GPU. Faked at the seam."""
    import torch
    import torch.distributed as dist

    from bridges.grpo import parallel
    from bridges.models import hardware

    calls: dict = {}
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: calls.update(backend=backend, **kw))
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.update(current=device))
    parallel.start(parallel.World(rank=1, size=2, local_rank=1), torch.device("cuda:1"))
    assert calls["backend"] == "nccl" and calls["device_id"] == torch.device("cuda:1")
    assert calls["current"] == torch.device("cuda:1") and hardware.thread_device() == torch.device("cuda:1")
    calls.clear()
    parallel.start(parallel.World(rank=1, size=2, local_rank=1), torch.device("cpu"))
    assert calls["backend"] == "gloo" and "device_id" not in calls and "current" not in calls
