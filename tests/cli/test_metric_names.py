"""Every backend that writes metrics.jsonl writes the shared metric names (bridges.runs.metrics.SHARED_METRICS)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bridges.runs.metrics import SHARED_METRICS
from bridges.train import main

SMALL = ["trainer.max_steps=2", "trainer.batch_size=2", "trainer.group_size=2", "sampling.max_tokens=4",
         "progress=false", "env=bridges_test_dense_letter_env"]
FUNCTIONS = ("repeated_letter", "lowercase_share")  # the environment's two rubric functions, weights 1 and 1
BACKENDS = {
    "grpo": [],
    "tinker": ["backend=tinker", "tinker.base_url=local"],
    "trl": ["backend=trl"],
}


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_each_backend_logs_the_shared_metric_names(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    assert main([*BACKENDS[backend], *SMALL, f"output_dir={tmp_path}", "run_name=r"]) == 0
    # every run starts with bridges.check's one-line verdict on the model's chat template
    printed = capsys.readouterr().out
    assert "template check: safe: prefix-preserving, ledger extends every turn" in printed
    rows = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        missing = [name for name in SHARED_METRICS if name not in row]
        assert not missing, f"{backend} lacks {missing}; it logs {sorted(row)}"
        assert 0.0 <= row["episodes/masked_fraction"] <= 1.0 and row["timing/step_s"] > 0
        assert row["lr"] > 0 and (row["grad_norm"] or 0.0) >= 0
        # each function's own score, unweighted, on every backend: the total is their weighted sum
        parts = [row[f"reward/{name}/mean"] for name in FUNCTIONS]
        assert all(0.0 <= p <= 1.0 for p in parts) and all(row[f"reward/{n}/std"] >= 0 for n in FUNCTIONS)
        if row.get("episodes/masked_fraction") == 0.0:
            assert row["reward/mean"] == pytest.approx(sum(parts), abs=1e-4), (backend, row)
    # the end of the run names each function's first -> last
    assert all(f"  {name}: " in printed for name in FUNCTIONS), printed[-2000:]
