"""The bundled v1 taskset trains two steps on every backend, each sample holding the sampled ids.

Runs in the main environment only (the backends are dev extras there); the v1 core runs under both
verifiers releases in ``test_verifiers_v1.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

SMALL = ["env=repeat_letter_taskset", "progress=false", "trainer.max_steps=2", "trainer.batch_size=2",
         "trainer.group_size=4", "run_name=v1"]  # fmt: skip


def _rows(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _check_run(run_dir: Path, backend: str) -> None:
    rows = _rows(run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["episodes/total"] == 8 and r["episodes/masked_fraction"] == 0.0 for r in rows)
    assert all(0.0 <= r["reward/mean"] <= 1.0 for r in rows)  # scored by the taskset's own @vf.reward
    if backend == "trl":  # TRL keeps no traces file; its rows carry the environment's metrics
        assert all(r["env/num_turns"] == 1.0 and r["rewards/repeated_letter/mean"] is not None for r in rows)
        return
    traces = [json.loads(x) for x in (run_dir / "traces.jsonl").read_text().splitlines()]
    assert len(traces) == 16 and {t["provenance"]["env_id"] for t in traces} == {"repeat_letter_taskset"}
    for trace in traces:
        (turn,) = trace["turns"]
        assert 0 < len(turn["completion_ids"]) == len(turn["logprobs"]) <= 6  # the env's agent caps at 6


@pytest.mark.parametrize("backend", ["grpo", "trl", "tinker"])
def test_two_steps_on_each_in_process_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str):
    from bridges.train import main

    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    extra = ["tinker.base_url=local"] if backend == "tinker" else []
    assert main([f"backend={backend}", f"output_dir={tmp_path}", *SMALL, *extra]) == 0
    _check_run(tmp_path / "v1", backend)


def test_verls_agent_loop_worker_trains_on_the_sampled_ids(
    tmp_path: Path, tiny_path: Path, tiny_tokenizer: Any
):
    from recording_server import RecordingServer
    from verl_harness import N, batch_of, compose, rows_of, run_worker

    cfg, files = compose(tmp_path, tiny_path, "", env="repeat_letter_taskset")
    client = RecordingServer(str(tiny_path))
    rows = rows_of(run_worker(cfg, batch_of(cfg, files, tiny_tokenizer), client), cfg)
    assert len(rows) == 2 * N
    sampled = sorted(ids for turns in client.sampled.values() for ids, _ in turns)
    assert sorted(row["response"] for row in rows) == sampled  # one model turn each, exactly as sampled
    for row in rows:
        assert (
            row["valid"] and row["stop"] == "completed" and all(row["mask"]) and 0 < len(row["response"]) <= 6
        )
        letter = tiny_tokenizer.decode(row["prompt"]).split("user\n")[-1][0]
        head = tiny_tokenizer.decode(row["response"])[:6]
        assert row["reward"] == pytest.approx(sum(ch == letter for ch in head) / 6)


def test_a_synchronous_grpo_run_is_the_native_tasks_run_step_for_step(tmp_path: Path):
    """num_batches_ahead=0 takes timing out of the run: the v1 taskset and repeat_letter, on the same
    rows and seeds, must give the same rewards and losses at every step (the async default pipelines
    by wall time, so there the two runs part after a few steps and both learn)."""
    from bridges.train import main

    runs = {}
    for env in ("repeat_letter", "repeat_letter_taskset"):
        argv = [f"env={env}", "progress=false", "trainer.max_steps=3", "trainer.batch_size=2", "trainer.group_size=4",
                "trainer.num_batches_ahead=0", f"output_dir={tmp_path}", f"run_name={env}"]  # fmt: skip
        assert main(argv) == 0
        runs[env] = _rows(tmp_path / env)
    native, v1 = runs["repeat_letter"], runs["repeat_letter_taskset"]
    assert len(native) == len(v1) == 3
    for a, b in zip(native, v1, strict=True):  # the same samples, so the same step
        assert (b["reward/mean"], b["samples/trained"]) == (a["reward/mean"], a["samples/trained"])
        # sampled logprobs enter the loss; the engine's batch shapes (timing) move fp32 sums in the 7th digit
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4, abs=1e-6)


def test_bridges_compare_evaluates_a_v1_taskset_on_two_backends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from bridges.compare import main

    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    argv = ["env=repeat_letter_taskset", "backends=[grpo,tinker]", "model=tiny", "num_examples=4",
            f"output={tmp_path}", "progress=false"]  # fmt: skip
    assert main(argv) == 0
    report = (tmp_path / "report.md").read_text()
    assert "| grpo |" in report and "| tinker |" in report and "repeat_letter_taskset" in report
