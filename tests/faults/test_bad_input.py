"""Every class of bad command-line input: one clear sentence on stderr, exit code 2, nothing started."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bridges.runs.config import run_cli

CASES = [  # (argv, the start of the sentence)
    (["trainer.max_step=3"], "unknown config key 'trainer.max_step' (did you mean 'trainer.max_steps'?)"),
    (["trainer.max_steps=abc"], "invalid value for config key 'trainer.max_steps'"),
    (["env=nope"], "no environment 'nope': it is not bundled"),
    (["backend=mlx"], "unknown backend 'mlx'; available backends: grpo, tinker, trl, verl"),
    (["backend=tinker"], "TINKER_API_KEY is not set"),
    (
        ["backend=tinker", "tinker.base_url=local", "sampling.temperature=0.5"],
        "sampling.temperature=0.5 is refused",
    ),
    (["backend=trl", "trl.not_a_field=1"], "'trl.not_a_field' is not a key of GRPOConfig"),
]


@pytest.mark.parametrize(
    ("argv", "start"), CASES, ids=[c[1].split(" ")[0] + str(i) for i, c in enumerate(CASES)]
)
def test_train_cli_bad_input(argv, start, capsys: pytest.CaptureFixture[str], monkeypatch):
    from bridges.train import main

    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    with pytest.raises(SystemExit) as info:
        run_cli(main, argv)
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2 and err.startswith(f"error: {start}"), err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert not Path("runs").exists()  # nothing was started (tests start in an empty folder of their own)


@pytest.mark.parametrize("extra", ["trl", "verl", "tinker"])
def test_a_missing_extra_names_the_pip_command(
    extra, capsys: pytest.CaptureFixture[str], monkeypatch
):
    from bridges.train import main

    monkeypatch.setitem(sys.modules, extra, None)  # as on a machine without the extra
    argv = [f"backend={extra}", *(["tinker.base_url=local"] if extra == "tinker" else [])]
    with pytest.raises(SystemExit) as info:
        run_cli(main, argv)
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2
    assert err == (
        f"error: '{extra}' is needed for backend={extra} but is not installed; "
        f"install it with pip install 'rl-bridges[{extra}]'."
    )
    assert not Path("runs").exists()


@pytest.mark.parametrize(
    ("module", "argv", "start"),
    [
        (
            "bridges.eval",
            ["env=reverse_text", "num_examples=-3"],
            "error: num_examples must be at least -1, got -3.",
        ),
        ("bridges.eval", ["bogus=1"], "error: unknown config key 'bogus'"),
        ("bridges.compare", ["backends=[grpo,mlx]"], "error: unknown backend 'mlx' in backends"),
        ("bridges.rescore", ["env=reverse_text"], "error: both traces=<file> and env=<id> are required"),
        (
            "bridges.adapters.tinker.server",
            ["host=0.0.0.0"],
            "error: refusing to serve on non-loopback host '0.0.0.0'",
        ),
    ],
)
def test_other_clis_in_a_subprocess(module: str, argv: list[str], start: str):
    repo = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-m", module, *argv], capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(repo)},
    )
    assert result.returncode == 2, result.stderr[-1000:]
    err = result.stderr.strip().splitlines()[-1]
    assert err.startswith(start) and err.endswith(".") and "Traceback" not in result.stderr
