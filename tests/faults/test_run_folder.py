"""Run folders are protected: no silent re-run on top of a run, and a damaged checkpoint costs only itself."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from trace_files import run_traces

from bridges.runs.config import run_cli
from bridges.train import main

SMALL = [
    "env=bridges_test_dense_env",  # a reward every group spreads on: a run that trained nothing is an error
    "trainer.batch_size=2",
    "trainer.group_size=2",
    "sampling.max_tokens=4",
    "progress=false",
    "run_name=r",
]


def steps_in(run_dir: Path) -> tuple[list[int], Counter[int]]:
    metrics = [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    traces = Counter(
        x["provenance"]["step"] for x in run_traces(run_dir)
    )
    return metrics, traces


def test_a_second_run_into_the_same_folder_is_refused_and_overwrite_replaces_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    args = [*SMALL, f"output_dir={tmp_path}", "trainer.max_steps=2"]
    assert main(args) == 0
    run_dir = tmp_path / "r"
    before = (run_dir / "metrics.jsonl").read_text()
    with pytest.raises(SystemExit) as info:
        run_cli(main, args)
    assert info.value.code == 2 and "already holds a run" in capsys.readouterr().err
    assert (run_dir / "metrics.jsonl").read_text() == before  # untouched
    assert main([*args[:-1], "trainer.max_steps=1", "overwrite=true"]) == 0
    metrics, traces = steps_in(run_dir)
    assert metrics == [1] and traces == {1: 4}
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_000001"]


def test_resume_skips_a_damaged_checkpoint_and_every_step_appears_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    args = [*SMALL, f"output_dir={tmp_path}", "save_every=2", "keep_checkpoints=0"]
    assert main([*args, "trainer.max_steps=4"]) == 0
    run_dir = tmp_path / "r"
    latest = run_dir / "checkpoints" / "step_000004"
    weights = next((latest / "model").glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # a save cut short
    capsys.readouterr()
    assert main([*args, "trainer.max_steps=5", "resume=true"]) == 0
    out = capsys.readouterr().out
    assert "checkpoint step_000004 is damaged ('model/model.safetensors' has" in out
    assert "resumed from" in out and "(step 2, data position 4)" in out
    metrics, traces = steps_in(run_dir)
    assert metrics == [1, 2, 3, 4, 5] and traces == {step: 4 for step in range(1, 6)}


def test_resume_with_every_checkpoint_damaged_is_one_sentence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    args = [*SMALL, f"output_dir={tmp_path}", "trainer.max_steps=1"]
    assert main(args) == 0
    (tmp_path / "r" / "checkpoints" / "step_000001" / "manifest.json").unlink()  # a save that never finished
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        run_cli(main, [*args, "resume=true"])
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2 and len(err.splitlines()) == 1
    assert "no checkpoint in" in err and "step_000001 is damaged (it has no manifest" in err


def test_checkpoints_hold_no_pickle(tmp_path: Path):
    assert main([*SMALL, f"output_dir={tmp_path}", "trainer.max_steps=1"]) == 0
    checkpoint = tmp_path / "r" / "checkpoints" / "step_000001"
    names = sorted(str(p.relative_to(checkpoint)) for p in checkpoint.rglob("*") if p.is_file())
    assert "trainer.safetensors" in names and "trainer.json" in names and "manifest.json" in names
    assert not [n for n in names if n.endswith((".pt", ".bin", ".pkl"))]
