"""Every tensor the trainer, the hf engine and the logprob step create names its device, and device and
precision settings are checked in one sentence before anything loads."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from bridges.runs.config import run_cli

ROOT = Path(__file__).resolve().parents[2]
# the code that builds tensors for a model on trainer.device: one created on the default (CPU) device
# would be a silent host-to-device copy per step on a GPU, or a device mismatch error
CHECKED = [*sorted((ROOT / "bridges" / "grpo").glob("*.py")), *sorted((ROOT / "adapters" / "hf").glob("*.py")),
           ROOT / "bridges" / "models" / "token_logprobs.py", ROOT / "adapters" / "tinker" / "local_model.py"]  # fmt: skip
FACTORIES = {"tensor", "zeros", "ones", "full", "empty", "arange", "rand", "randn", "randint", "linspace", "eye",
             "as_tensor", "Generator"}  # fmt: skip


def tensors_without_a_device(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in FACTORIES
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"
            and not any(k.arg == "device" for k in node.keywords)
        ):  # fmt: skip
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} torch.{node.func.attr}(...)")
    return found


def test_every_tensor_the_trainer_and_the_hf_engine_create_names_its_device():
    missing = [line for path in CHECKED for line in tensors_without_a_device(path)]
    assert not missing, "tensors created without device=:\n" + "\n".join(missing)


def test_the_check_finds_a_tensor_without_a_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    code = tmp_path / "bad.py"
    code.write_text("import torch\nx = torch.zeros(3, dtype=torch.long)\ny = torch.ones(2, device=d)\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert tensors_without_a_device(code) == ["bad.py:2 torch.zeros(...)"]


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
)  # fmt: skip
def test_bad_device_precision_and_process_settings_are_one_sentence(argv, piece, capsys):
    from bridges.train import main

    with pytest.raises(SystemExit) as exit_info:
        run_cli(main, argv)
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and piece in err and len(err.splitlines()) == 1, err
    assert not Path("runs").exists()
