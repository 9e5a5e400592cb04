"""The backend seam: every backend is one declared ``Backend``; its section is typed and checked before
anything loads; a package can add a backend with its own section without touching a core file."""

from __future__ import annotations

import dataclasses
import importlib
import textwrap
from pathlib import Path
from typing import Any

import pytest

from bridges.runs.backends import BUILTIN_BACKENDS, Backend, resolve_backend
from bridges.runs.config import run_cli
from bridges.runs.train_config import shared_keys
from bridges.train import main


def test_every_builtin_backend_declares_itself():
    for name in BUILTIN_BACKENDS:
        backend = resolve_backend(name)
        assert isinstance(backend, Backend) and backend.name == name
        assert backend.honoured_keys <= shared_keys() and "trainer.learning_rate" in backend.honoured_keys
    assert resolve_backend("grpo").honoured_keys == shared_keys()  # the bundled trainer reads them all


def refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        run_cli(main, argv)
    err = capsys.readouterr().err
    assert exited.value.code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    ("argv", "piece"),
    [
        (["backend=trl", "trl.scale_reward=none"], "'trl.scale_reward' is not a key of GRPOConfig (did you mean 'trl.scale_rewards'?)"),
        (["backend=trl", "trl.num_iterations=[1]"], "trl.num_iterations must be an integer in GRPOConfig, got [1]"),
        (["backend=trl", "trl.use_vllm=3"], "trl.use_vllm must be true or false in GRPOConfig, got 3"),
        (["backend=verl", "verl.trainer.n_gpu_per_node=1"], "did you mean 'verl.trainer.n_gpus_per_node'?"),
        (["backend=verl", "verl.trainer=5"], "'verl.trainer' is a section of verl's PPO trainer config; set its keys"),
        (["backend=verl", "verl.trainer.total_epochs=many"], "verl.trainer.total_epochs must be a number in verl's PPO trainer config, got 'many'"),
        (["backend=tinker", "tinker.base_url=local", "tinker.adam_eps=-1"], "tinker.adam_eps must be greater than 0.0"),
    ],
)
def test_native_sections_are_checked_against_the_native_config(
    argv: list[str], piece: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    err = refusal([*argv, f"output_dir={tmp_path}", "dry_run=true"], capsys)
    assert piece in err, err
    assert not any(tmp_path.iterdir())  # refused before anything was written


def test_a_new_verl_key_is_passed_with_plus(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    code = main(["backend=verl", "dry_run=true", f"output_dir={tmp_path}", "verl.+trainer.my_key=7"])
    assert code == 0 and "+trainer.my_key=7" in capsys.readouterr().out


PLUGIN = """
import dataclasses
from bridges.runs.backends import Backend, typed_options
from bridges.runs.config import option
from bridges.runs.train_config import shared_keys

SEEN = []

@dataclasses.dataclass
class Options:
    depth: int = option(1, ge=1, help="how deep")

def run(config, options):
    SEEN.append((config.env, options))
    return 0

BACKEND = Backend(name="mine", run=run, honoured_keys=shared_keys() - {"trainer.beta"},
                  parse_options=typed_options(Options, "mine"))
NOT_A_BACKEND = run
"""


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """An installed package (a dist-info on sys.path) registering two ``rl_bridges.backends`` entries."""
    (tmp_path / "mine_backend.py").write_text(textwrap.dedent(PLUGIN))
    info = tmp_path / "mine_backend-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mine-backend\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[rl_bridges.backends]\nmine = mine_backend:BACKEND\nbroken = mine_backend:NOT_A_BACKEND\n"
        "gone = removed_package.backend:BACKEND\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    return importlib.import_module("mine_backend")


def test_an_installed_backend_gets_its_own_typed_section(
    plugin: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    out = f"output_dir={tmp_path / 'runs'}"
    assert main(["backend=mine", "mine.depth=3", out]) == 0
    ((env, options),) = plugin.SEEN
    assert env == "repeat_letter" and dataclasses.is_dataclass(options) and options.depth == 3
    assert "mine.depth must be at least 1, got 0" in refusal(["backend=mine", "mine.depth=0", out], capsys)
    assert "unknown config key 'mine.deep'" in refusal(["backend=mine", "mine.deep=2", out], capsys)
    assert "backend=mine does not use trainer.beta" in refusal(
        ["backend=mine", "trainer.beta=0.1", out], capsys
    )
    err = refusal(["backend=broken", out], capsys)
    assert "backend 'broken' (mine_backend:NOT_A_BACKEND) does not name a bridges.runs.backends.Backend" in err
    err = refusal(["backend=gone", out], capsys)
    assert "backend 'gone' (removed_package.backend:BACKEND) cannot be imported: No module named" in err
    assert len(plugin.SEEN) == 1  # nothing refused ever ran
