"""``python -m bridges.eval``: results saved per group, resume without regenerating, one-sentence errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bridges.eval import main
from bridges.runs.config import run_cli


def rows(output: Path) -> list[dict]:
    return [json.loads(line) for line in (output / "results.jsonl").read_text().splitlines()]


def exit_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run the CLI as ``python -m`` would and return its stderr, asserting exit code 2 and one line."""
    with pytest.raises(SystemExit) as info:
        run_cli(main, argv)
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1 and err.endswith(".")
    return err


def test_eval_saves_every_rollout_and_resumes_only_missing_groups(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from datasets import load_from_disk

    out = tmp_path / "run"
    argv = ["env=repeat_letter", "model=tiny", "num_examples=4", "rollouts_per_example=2", f"output={out}"]
    assert main([*argv, "progress=false"]) == 0
    printed = capsys.readouterr().out
    assert "0 rows resumed" in printed and "generating 8 rows (4 examples)" in printed
    assert "reward" in printed and "pass@2" in printed and "stop reasons              completed 8" in printed
    first = rows(out)
    assert len(first) == 8 and sorted({r["example_id"] for r in first}) == [0, 1, 2, 3]
    for r in first:
        assert r["stop_reason"] == "completed" and r["error"] is None and 0.0 <= r["reward"] <= 1.0
        assert r["turns"][0]["completion_ids"] and len(r["turns"][0]["completion_ids"]) <= 6
    metadata = json.loads((out / "metadata.json").read_text())
    assert metadata["token_ids"] is True and metadata["sampling_args"] == {"max_tokens": 6}
    assert metadata["new_rows"] == 8 and metadata["summary"]["num_rollouts"] == 8

    # a crash mid-write leaves a partial group behind: only that group is generated again
    lines = (out / "results.jsonl").read_text().splitlines(keepends=True)
    (out / "results.jsonl").write_text("".join(lines[:7]) + lines[7][:20])
    assert main([*argv, "progress=false"]) == 0
    printed = capsys.readouterr().out
    assert "6 rows resumed" in printed and "generating 2 rows (1 examples)" in printed
    again = rows(out)
    assert len(again) == 8 and again[:6] == first[:6]
    assert len(load_from_disk(str(out / "dataset"))) == 8

    # nothing left to do: no generation at all, the saved rows are untouched
    assert main([*argv, "progress=false"]) == 0
    assert "8 rows resumed" in capsys.readouterr().out
    assert rows(out) == again


def test_resume_with_other_settings_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    (out).mkdir()
    (out / "results.jsonl").write_text("")
    saved = {
        "env": "repeat_letter",
        "env_args": {},
        "model": "tiny",
        "rollouts_per_example": 2,
        "split": "eval",
    }
    (out / "metadata.json").write_text(json.dumps(saved))
    err = exit_error(["env=repeat_letter", "rollouts_per_example=3", f"output={out}"], capsys)
    assert "rollouts_per_example=2" in err and "rollouts_per_example=3" in err
    err = exit_error(["env=reverse_text", "rollouts_per_example=2", f"output={out}"], capsys)
    assert 'env="repeat_letter"' in err


def test_unknown_key_is_one_sentence(capsys: pytest.CaptureFixture[str]) -> None:
    err = exit_error(["env=repeat_letter", "num_exmples=3"], capsys)
    assert "num_exmples" in err and "num_examples" in err


def test_unknown_env_lists_the_bundled_ones(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    err = exit_error(["env=no_such_env", f"output={tmp_path}"], capsys)
    for bundled in ("alphabet_sort", "arithmetic", "guess_number", "repeat_letter", "reverse_text"):
        assert bundled in err


def test_bad_env_args_and_values_are_one_sentence(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert "colour" in exit_error(["env=repeat_letter", "env_args.colour=red", f"output={tmp_path}"], capsys)
    assert "length" in exit_error(["env=repeat_letter", "env_args.length=0", f"output={tmp_path}"], capsys)
    assert "engine" in exit_error(["engine=vllm"], capsys)
    assert "split" in exit_error(["split=test"], capsys)


def test_openai_engine_without_api_key(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MY_TEST_KEY", raising=False)
    err = exit_error(
        ["engine=openai", "model=gpt-x", "api_key_var=MY_TEST_KEY", f"output={tmp_path}"], capsys
    )
    assert "MY_TEST_KEY" in err
    assert not (tmp_path / "results.jsonl").exists()


def test_done_when_command_in_a_subprocess(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "reverse"
    cmd = [
        sys.executable, "-m", "bridges.eval", "env=reverse_text", "model=tiny", "num_examples=8",
        "rollouts_per_example=2", f"output={out}", "sampling.max_tokens=8", "progress=false",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    assert "generating 16 rows (8 examples)" in done.stdout and "reward" in done.stdout
    assert len(rows(out)) == 16
    assert json.loads((out / "metadata.json").read_text())["sampling_args"]["max_tokens"] == 8
    # resuming runs no generation (checked in-process: cheaper than a second interpreter)
    assert main(cmd[3:]) == 0
    assert "16 rows resumed from" in capsys.readouterr().out
    assert len(rows(out)) == 16


def test_default_output_names_env_and_model() -> None:
    from bridges.jobs.evaluate import default_output

    assert default_output("reverse_text", "tiny") == Path("outputs/reverse_text--tiny")
    assert default_output("arithmetic", "Qwen/Qwen3-0.6B") == Path("outputs/arithmetic--Qwen3-0.6B")
    assert default_output("arithmetic", "./ckpt/step 10/") == Path("outputs/arithmetic--step-10")


def test_read_results_keeps_only_complete_groups(tmp_path: Path) -> None:
    from bridges.jobs.eval_resume import read_results

    path = tmp_path / "results.jsonl"
    assert read_results(path, 2) == ([], False)
    lines = [{"example_id": 0, "n": 1}, {"example_id": 0, "n": 2}, {"example_id": 1, "n": 3}]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"example_id": 2, "tru')
    kept, dropped = read_results(path, 2)
    assert [r["n"] for r in kept] == [1, 2] and dropped
    path.write_text("".join(json.dumps(x) + "\n" for x in lines[:2]))
    assert read_results(path, 2) == (lines[:2], False)


SCORED_ENV = '''
from datasets import Dataset
import bridges as br

def load_environment(mode: str = "ok", held_out: bool = True) -> br.Environment:
    rows = [{"question": f"Say {i}", "answer": str(i)} for i in range(4)]
    def correct(completion, answer) -> float:
        if answer == "2" and mode == "raise":
            raise ValueError("no score for two")
        if answer == "2" and mode == "none":
            return None
        return float(completion[-1]["content"].strip() == answer)
    held = Dataset.from_list(rows) if held_out else None
    return br.SingleTurnEnv(dataset=Dataset.from_list(rows), eval_dataset=held, rubric=br.Rubric(funcs=[correct]),
                            sampling_args={"max_tokens": 3})
'''


@pytest.fixture
def scored_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "scored_env.py").write_text(SCORED_ENV)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "scored_env"


@pytest.mark.parametrize("mode", ["raise", "none"])
def test_a_reward_that_fails_exits_2_quoting_it_and_the_same_command_scores_it_again_once_fixed(
    mode: str, scored_env: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    argv = [f"env={scored_env}", "model=tiny", "progress=false", f"output={out}"]
    err = exit_error([*argv, f"env_args.mode={mode}"], capsys)
    said = "raised ValueError: no score for two" if mode == "raise" else "returned None"
    assert err.startswith(f"error: reward function 'correct' {said}") and "(example 2, prompt 'Say 2'; 1 of 4" in err
    assert len(rows(out)) == 4  # everything was written first
    # env_args differ once fixed, so the fixed environment is the same env called with mode=ok: start afresh
    err = exit_error([*argv, "env_args.mode=ok"], capsys)
    assert 'env_args={"mode": "' in err and "overwrite=true" in err


def test_a_reward_fixed_in_place_regenerates_only_the_failed_group(
    scored_env: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    argv = [f"env={scored_env}", "model=tiny", "progress=false", f"output={out}"]
    exit_error([*argv, "env_args.mode=raise"], capsys)
    module = tmp_path / "scored_env.py"  # the user fixes the reward in the same file, same arguments
    module.write_text(SCORED_ENV.replace('raise ValueError("no score for two")', "return 0.0"))
    sys.modules.pop(scored_env, None)
    assert main([*argv, "env_args.mode=raise"]) == 0
    printed = capsys.readouterr().out
    assert "3 rows resumed" in printed and "generating 1 rows (1 examples)" in printed
    assert sorted(r["example_id"] for r in rows(out)) == [0, 1, 2, 3] and all(r["error"] is None for r in rows(out))


def test_resumed_rows_were_made_with_the_same_sampling_or_overwrite_starts_afresh(
    scored_env: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    argv = [f"env={scored_env}", "model=tiny", "progress=false", f"output={out}", "num_examples=2"]
    assert main(argv) == 0
    assert "made with this model" not in capsys.readouterr().out
    err = exit_error([*argv, "sampling.max_tokens=1"], capsys)
    assert 'sampling_args={"max_tokens": 3}, not sampling_args={"max_tokens": 1}' in err and "overwrite=true" in err
    (out / "notes.txt").write_text("mine")
    assert main([*argv, "sampling.max_tokens=1", "overwrite=true"]) == 0
    assert "0 rows resumed" in capsys.readouterr().out
    assert all(len(r["turns"][0]["completion_ids"]) == 1 for r in rows(out))
    assert (out / "notes.txt").read_text() == "mine"  # overwrite removes only what an evaluation wrote
    assert main([*argv, "sampling.max_tokens=1"]) == 0
    assert "2 rows resumed from" in capsys.readouterr().out


def test_a_local_model_changed_in_place_is_another_model(
    scored_env: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    from bridges.models.tiny import tiny_model_path

    model = tmp_path / "model"
    shutil.copytree(tiny_model_path(), model)
    argv = [f"env={scored_env}", f"model={model}", "progress=false", f"output={tmp_path / 'run'}", "num_examples=1"]
    assert main(argv) == 0
    (model / "config.json").write_text((model / "config.json").read_text() + "\n")  # exported again, say
    assert "model_fingerprint=" in exit_error(argv, capsys)


def test_an_environment_without_an_eval_split_is_one_sentence_and_split_train_is_named(
    scored_env: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [f"env={scored_env}", "env_args.held_out=false", "model=tiny", "progress=false", f"output={tmp_path / 'r'}"]
    err = exit_error(argv, capsys)
    assert "has no eval split" in err and "split=train" in err
    assert not (tmp_path / "r").exists()
    assert main([*argv, "split=train"]) == 0
    assert "split=train (the training rows)" in capsys.readouterr().out
