"""Every script in examples/ runs as its docstring says, on the tiny model, with no download."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run an example as a user would; from the test's own folder unless ``cwd`` says where (nothing is
    written into the checkout, byte-compiled files included). Under ``-X faulthandler``: a native crash
    (the TRL drop-in died once of SIGSEGV in CI) leaves its Python stack in the stderr an assertion quotes."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(
        [sys.executable, "-X", "faulthandler", *args], cwd=cwd, capture_output=True, text=True, timeout=300, env=env
    )


def test_my_env_is_the_readmes_environment():
    readme = re.search(r"```python\n# my_env.py\n(.*?)```", (REPO / "README.md").read_text(), flags=re.S)
    assert readme is not None and (EXAMPLES / "my_env.py").read_text().endswith(readme.group(1))


def test_my_env_evaluates_from_its_folder(tmp_path: Path):
    out = tmp_path / "my_env"
    result = run(
        "-m", "bridges.eval", "env=my_env", "model=tiny", "num_examples=3", "rollouts_per_example=2",
        "progress=false", f"output={out}", cwd=EXAMPLES,
    )
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and all(r["stop_reason"] == "completed" for r in rows)
    for r in rows:  # the reward is the weighted sum of the two functions, each also kept as a metric
        assert r["reward"] == pytest.approx(r["metrics"]["correct"] + 0.2 * r["metrics"]["a_number"])
        assert len(r["turns"][0]["completion_ids"]) <= 2  # the environment's own sampling: two tokens
    assert {k: rows[0]["prompt"][0][k] for k in ("role", "content")} == {
        "role": "system",
        "content": "Answer with the number only.",
    }


def test_the_guides_countdown_env_runs_several_turns_and_scores_them(tmp_path: Path):
    """docs/guide/environments.md's multi-turn example: turns alternate until a stop, each rollout scored."""
    out = tmp_path / "countdown"
    result = run(
        "-m", "bridges.eval", "env=countdown_env", "model=tiny", "num_examples=3", "rollouts_per_example=2",
        "split=train",
        "env_args.max_turns=3", "progress=false", f"output={out}", cwd=EXAMPLES,
    )
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and all(r["error"] is None for r in rows)
    assert all(r["stop_reason"] in ("max_turns", "reached_zero") for r in rows), [r["stop_reason"] for r in rows]
    assert all(0.0 <= r["metrics"]["correct_steps"] <= 1.0 for r in rows)
    assert any(sum(m["role"] == "assistant" for m in r["completion"]) == 3 for r in rows)  # several turns ran


def test_token_exact_client_reuses_the_first_turn(tmp_path: Path):
    result = run(str(EXAMPLES / "token_exact_client.py"))
    assert result.returncode == 0, result.stderr
    assert "drift_tokens=0" in result.stdout and "reused from turn 1" in result.stdout


def test_trl_drop_in_trains_a_multi_turn_env(tmp_path: Path):
    result = run(str(EXAMPLES / "trl_drop_in.py"), "guess_number", "2", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]  # a crash's faulthandler stack is at the end
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("trained 2 steps on guess_number: reward ")
    lines = (EXAMPLES / "trl_drop_in.py").read_text().splitlines()
    assert sum("# rl-bridges" in line for line in lines) <= 3  # the drop-in promise


def test_streaming_agent_forces_a_call_and_extends_the_ledger():
    result = run(str(EXAMPLES / "streaming_agent.py"))
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("family: qwen3; streamed call: lookup(")
    assert lines[1].startswith("top-3 alternatives of the first sampled token: [")
    assert "exactly turn 1's prompt + sample" in lines[2]


@pytest.mark.slow
def test_recipe_each_stage_beats_the_one_before(tmp_path: Path):
    """eval -> teacher rollouts -> export -> SFT -> eval -> RL -> eval, as the README shows it."""
    result = subprocess.run([sys.executable, str(EXAMPLES / "recipe_warmup.py"), str(tmp_path / "recipe")],
                            cwd=EXAMPLES, capture_output=True, text=True, timeout=900,
                            env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    scores = dict(pair.split("=") for pair in result.stdout.strip().splitlines()[-1].split())
    before, after_sft, after_rl = (float(scores[k]) for k in ("before", "after_sft", "after_rl"))
    assert before < 0.05 < after_sft < after_rl
