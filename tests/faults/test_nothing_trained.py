"""A run in which no step had anything to learn from (every group's rewards equal) ends in one sentence
with exit 2, its files written, on every backend that trains here; a run with one such step does not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trace_files import run_traces

from bridges.runs.config import run_cli
from bridges.runs.metrics import check_something_trained
from bridges.runtime.errors import NothingTrainedError

CONSTANT_REWARD = """
from datasets import Dataset
import bridges as br


def load_environment():
    rows = [{"question": f"Say {c}.", "answer": c} for c in "abcd"]
    return br.SingleTurnEnv(dataset=Dataset.from_list(rows), rubric=br.Rubric(funcs=[lambda completion: 1.0]))
"""


ALWAYS_RAISES = """
from datasets import Dataset
import bridges as br


class Broken(br.MultiTurnEnv):
    async def env_response(self, messages, state):
        raise RuntimeError("no turn for you")


def load_environment():
    rows = [{"question": f"Say {c}.", "answer": c} for c in "abcd"]
    return Broken(dataset=Dataset.from_list(rows), rubric=br.Rubric(funcs=[lambda completion: 1.0]), max_turns=3)
"""


@pytest.mark.parametrize("backend", ["grpo", "trl"])
def test_a_run_that_trained_nothing_is_one_sentence_and_exit_2(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    from bridges.train import main

    (tmp_path / "constant_reward.py").write_text(CONSTANT_REWARD)
    monkeypatch.syspath_prepend(str(tmp_path))
    args = [f"backend={backend}", "env=constant_reward", f"output_dir={tmp_path}", "run_name=r", "progress=false",
            "trainer.max_steps=2", "trainer.batch_size=2", "trainer.group_size=2", "sampling.max_tokens=4"]
    with pytest.raises(SystemExit) as exit_info:
        run_cli(main, args)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith("error: nothing was trained in 2 steps: in every group all rollouts earned the same reward")
    rows = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and (tmp_path / "r" / "reward_curve.png").exists()


def test_one_step_with_something_to_learn_is_enough():
    nothing = {"reward/mean": 0.0, "samples/trained": 0}
    with pytest.raises(NothingTrainedError, match="in 3 steps"):
        check_something_trained([{"step": s, **nothing} for s in (1, 2, 3)])
    check_something_trained([{"step": 1, **nothing}, {"step": 2, "reward/mean": 0.1, "samples/trained": 4}])
    # TRL's rows: the share of groups without reward spread; verl's: the step's reward spread
    with pytest.raises(NothingTrainedError):
        check_something_trained([{"step": 1, "reward/mean": 1.0, "groups/zero_variance_fraction": 1.0}])
    check_something_trained([{"step": 1, "reward/mean": 0.5, "groups/zero_variance_fraction": 0.5}])
    with pytest.raises(NothingTrainedError):
        check_something_trained([{"step": 1, "reward/mean": 0.0, "reward/std": 0.0}])
    check_something_trained([{"step": 1, "reward/mean": 0.2, "reward/std": 0.1}])
    check_something_trained([])  # no step ran: nothing to judge
    masked = {"reward/mean": None, "samples/trained": 0, "episodes/masked_fraction": 1.0}
    with pytest.raises(NothingTrainedError, match="every rollout was masked"):
        check_something_trained([{"step": 1, **masked}, {"step": 2, **masked}])


def test_a_run_whose_every_rollout_fails_says_so(tmp_path: Path, monkeypatch, capsys):
    from bridges.train import main

    (tmp_path / "always_raises.py").write_text(ALWAYS_RAISES)
    monkeypatch.syspath_prepend(str(tmp_path))
    args = ["env=always_raises", f"output_dir={tmp_path}", "run_name=r", "progress=false", "trainer.max_steps=2",
            "trainer.batch_size=2", "trainer.group_size=2", "sampling.max_tokens=4"]
    with pytest.raises(SystemExit) as exit_info:
        run_cli(main, args)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith("error: nothing was trained in 2 steps: every rollout was masked")
    traces = run_traces(tmp_path / "r")
    assert len(traces) == 8 and all(t["stop_reason"] == "env_error" and "no turn for you" in t["error"] for t in traces)
