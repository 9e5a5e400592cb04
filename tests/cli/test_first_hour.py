"""A newcomer's small stumbles each end in one sentence that says what to do (issue 54's smaller items)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridges.runs.config import run_cli
from bridges.train import main as train


def one_sentence(argv: list[str], capsys: pytest.CaptureFixture[str], main=train) -> str:
    with pytest.raises(SystemExit) as info:
        run_cli(main, argv)
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2 and len(err.splitlines()) == 1 and err.endswith("."), err
    return err


def test_a_dashed_argument_is_refused_with_the_form_that_works(capsys: pytest.CaptureFixture[str]):
    err = one_sentence(["--trainer.max-steps=3"], capsys)
    assert err == "error: argument '--trainer.max-steps=3' has leading dashes; arguments are key=value: trainer.max_steps=3."


def test_help_for_an_unknown_section_lists_sections_and_backends(capsys: pytest.CaptureFixture[str]):
    err = one_sentence(["help=1"], capsys)
    assert "sections: " in err and "trainer" in err and "backends: " in err
    assert all(name in err.split("backends: ")[1] for name in ("grpo", "trl", "verl", "tinker"))


def test_a_run_folder_passed_as_a_model_points_at_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    from bridges.eval import main as evaluate

    run = tmp_path / "grpo-my_env"
    run.mkdir()
    (run / "metrics.jsonl").write_text("{}\n")
    err = one_sentence([f"model={run}", "env=repeat_letter", f"output={tmp_path / 'out'}"], capsys, main=evaluate)
    assert "is a training run's folder" in err and f"python -m bridges.export model={run} output=models/grpo-my_env" in err


def test_did_you_mean_includes_the_working_folders_modules(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    (tmp_path / "my_words_env.py").write_text("def load_environment(): ...\n")
    monkeypatch.chdir(tmp_path)
    err = one_sentence(["env=my_word_env", "dry_run=true"], capsys)
    assert "(did you mean 'my_words_env'?)" in err


def test_models_and_runs_are_ignored_by_git():
    ignored = (Path(__file__).resolve().parents[2] / ".gitignore").read_text().splitlines()
    assert {"/runs/", "/outputs/", "/models/"} <= set(ignored)
