"""``python -m bridges.compare``: paired rollouts across backends, a verdict, and the report."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from bridges.compare import main
from bridges.jobs.compare_report import paired_bootstrap, verdict
from bridges.runs.config import run_cli

ENVS = Path(__file__).parent / "envs"


@pytest.fixture(autouse=True)
def _envs_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ENVS))


def run_compare(tmp_path: Path, *extra: str) -> str:
    argv = [
        "env=bridges_test_compare_env",
        "model=tiny",
        "num_examples=6",
        "rollouts_per_example=4",
        f"output={tmp_path}",
    ]
    assert main([*argv, *extra]) == 0
    return (tmp_path / "report.md").read_text()


def test_identical_engines_give_identical_paired_rewards_and_say_same(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    report = run_compare(tmp_path, "backends=[grpo,trl,verl]")
    printed = capsys.readouterr().out
    # the same rows and seeds through the same model: every rollout pair is identical
    assert "grpo vs trl: difference +0.0000 [+0.0000, +0.0000] -> same" in printed
    assert "grpo vs verl: difference +0.0000 [+0.0000, +0.0000] -> same" in printed
    from datasets import load_from_disk

    rows = load_from_disk(str(tmp_path / "results"))
    assert len(rows) == 72 and set(rows["backend"]) == {"grpo", "trl", "verl"}
    rewards = {b: [r["reward"] for r in rows if r["backend"] == b] for b in ("grpo", "trl", "verl")}
    assert rewards["grpo"] == rewards["trl"] == rewards["verl"] and len(set(rewards["grpo"])) > 1
    assert "| grpo − trl | 0.0000 | [0.0000, 0.0000] | 24 | same |" in report
    identical = "every backend sampled the same completions token for token"
    assert identical in printed and identical in report and "nothing to compare" not in report  # rewards spread
    assert "tokens/s" not in report  # a few rows evaluated once time start-up, not the engine
    assert (tmp_path / "rewards.png").stat().st_size > 1000 and "<table>" in (
        tmp_path / "report.html"
    ).read_text()


def test_a_different_temperature_on_one_backend_says_differ(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    report = run_compare(tmp_path, "backends=[grpo,trl]", "backend_sampling.trl.temperature=0.05")
    assert "-> differ" in capsys.readouterr().out
    assert "| differ |" in report and "same completions token for token" not in report


def test_bootstrap_verdicts_on_known_differences():
    same = paired_bootstrap([0.5, 0.7, 0.2, 0.9] * 10, [0.5, 0.7, 0.2, 0.9] * 10)
    assert same[:3] == (0.0, 0.0, 0.0) and verdict(same[1], same[2]) == "same"
    shifted = paired_bootstrap([0.6, 0.8, 0.3, 1.0] * 10, [0.5, 0.7, 0.2, 0.9] * 10)
    assert shifted[0] == pytest.approx(0.1) and verdict(shifted[1], shifted[2]) == "differ"
    noisy = paired_bootstrap([0.0, 1.0] * 20, [1.0, 0.0] * 20)  # mean difference 0, large spread
    assert verdict(noisy[1], noisy[2]) == "same"
    assert paired_bootstrap([None, 0.5], [0.1, None])[3] == 0  # errored rollouts leave no pair


def test_finished_runs_add_their_reward_curves(tmp_path: Path):
    for name, rewards in (("grpo-x", [0.1, 0.4, 0.8]), ("trl-x", [0.1, 0.3, 0.5])):
        run = tmp_path / "runs" / name
        run.mkdir(parents=True)
        lines = [json.dumps({"step": i + 1, "reward/mean": r}) for i, r in enumerate(rewards)]
        (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    runs = f"runs=[{tmp_path / 'runs' / 'grpo-x'},{tmp_path / 'runs' / 'trl-x'}]"
    assert main(["backends=[]", runs, f"output={tmp_path / 'out'}"]) == 0
    report = (tmp_path / "out" / "report.md").read_text()
    assert "| grpo-x | 3 | 0.1000 | 0.8000 |" in report and "| trl-x | 3 | 0.1000 | 0.5000 |" in report
    assert "## Training runs compared" in report and "| grpo-x | trl-x |" in report
    assert (tmp_path / "out" / "curves.png").stat().st_size > 1000


def test_curves_are_drawn_against_samples_seen_when_every_run_logs_them(tmp_path: Path):
    from bridges.jobs.compare import read_curves

    for name, per_step in (("small", 4), ("large", 16)):
        run = tmp_path / name
        run.mkdir()
        rows = [{"step": i + 1, "reward/mean": 0.1 * i, "episodes/total": per_step} for i in range(3)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    curves, axis = read_curves([str(tmp_path / "small"), str(tmp_path / "large")])
    assert axis == "samples seen"
    assert [x for x, _ in curves["small"]] == [4, 8, 12] and [x for x, _ in curves["large"]] == [16, 32, 48]
    (tmp_path / "small" / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\n")
    curves, axis = read_curves([str(tmp_path / "small"), str(tmp_path / "large")])
    assert axis == "step" and curves["small"] == [(1, 0.5)] and [x for x, _ in curves["large"]] == [1, 2, 3]


def test_bad_input_is_one_sentence(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    for argv, message in [
        (["backends=[grpo,mlx]"], "unknown backend 'mlx' in backends"),
        (["backends=[grpo]", "backend_sampling.trl.temperature=0.5"], "backend_sampling.trl names a backend"),
        (["backends=[]", f"runs=[{tmp_path}]"], "has no metrics.jsonl"),
    ]:
        with pytest.raises(SystemExit) as info:
            run_cli(main, [*argv, f"output={tmp_path / 'o'}"])
        err = capsys.readouterr().err.strip()
        assert info.value.code == 2 and err.startswith("error: ") and message in err and "\n" not in err


@pytest.mark.slow
def test_done_when_command_on_three_backends(tmp_path: Path):
    command = [
        sys.executable, "-m", "bridges.compare", "env=reverse_text", "backends=[grpo,trl,tinker]", "model=tiny",
        "num_examples=8", f"output={tmp_path}",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    report = (tmp_path / "report.md").read_text()
    for backend in ("grpo", "trl", "tinker"):
        assert f"| {backend} |" in report
    assert "tinker (local server)" in report and (tmp_path / "rewards.png").exists()
    # a random model earns 0 on reverse_text everywhere: the report says the verdicts mean nothing
    assert "nothing to compare: every rollout of every backend earned reward 0" in report
    assert "nothing to compare" in result.stdout


def test_caveats_are_said_only_when_they_hold():
    from bridges.jobs.compare_report import BackendResult, caveats

    def result(name: str, rewards: list[float], ids: list[list[int]]) -> BackendResult:
        rows = [{"turns": [{"completion_ids": i}]} for i in ids]
        return BackendResult(name, "hf", rewards, ["completed"] * len(rewards), [0] * len(rewards), 0, 1.0, rows)

    zero, same = caveats([result("a", [0.0, 0.0], [[1], [2]]), result("b", [0.0, 0.0], [[1], [3]])]), None
    assert len(zero) == 1 and zero[0].startswith("nothing to compare")
    same = caveats([result("a", [0.5, 1.0], [[1], [2]]), result("b", [0.5, 1.0], [[1], [2]])])
    assert len(same) == 1 and same[0].startswith("every backend sampled the same completions")
    assert caveats([result("a", [0.5, 1.0], [[1], [2]]), result("b", [0.5, 0.0], [[1], [4]])]) == []


def test_curves_get_a_verdict_each_and_per_pair(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """Learned or not (last k steps against the first k), and per pair same / better / worse (their last k
    steps), each with a bootstrap interval over steps."""
    from bridges.jobs.curve_verdict import learned, pair_rows

    draw = random.Random(0)
    rising = [min(1.0, 0.1 + 0.02 * step + draw.uniform(-0.05, 0.05)) for step in range(40)]
    flat = [0.3 + draw.uniform(-0.05, 0.05) for _ in range(40)]
    twin = [r + draw.uniform(-0.02, 0.02) for r in rising]
    assert learned(rising, 10).verdict("learned", "got worse", "did not learn") == "learned"
    assert learned(flat, 10).verdict("learned", "got worse", "did not learn") == "did not learn"
    two_steps = learned([0.0, 0.5], 10)  # one step at each end: no spread to judge by, so no verdict
    assert two_steps.value == 0.5 and two_steps.verdict("learned", "got worse", "did not learn") == "n/a"
    verdicts = {(a, b): said for a, b, _, said in pair_rows({"rising": rising, "flat": flat, "twin": twin}, 10, 2000, 0)[1:]}
    assert verdicts == {("rising", "flat"): "rising better", ("rising", "twin"): "same", ("flat", "twin"): "flat worse"}
    for name, rewards in (("rising", rising), ("flat", flat)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text(
            "".join(json.dumps({"step": i + 1, "reward/mean": r}) + "\n" for i, r in enumerate(rewards)))
    assert main(["backends=[]", f"runs=[{tmp_path / 'rising'},{tmp_path / 'flat'}]", f"output={tmp_path / 'out'}"]) == 0
    printed = capsys.readouterr().out
    assert "-> learned" in printed and "-> did not learn" in printed and "rising vs flat: last 10 steps +" in printed
    assert printed.count("-> rising better") == 1
