"""Every backend that writes metrics.jsonl writes the shared metric names (bridges.runs.metrics.SHARED_METRICS)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bridges.runs.metrics import SHARED_METRICS
from bridges.train import main

SMALL = ["trainer.max_steps=2", "trainer.batch_size=2", "trainer.group_size=2", "sampling.max_tokens=4",
         "progress=false", "env=bridges_test_dense_env"]
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
    assert "template check: safe: prefix-preserving, ledger extends every turn" in capsys.readouterr().out
    rows = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        missing = [name for name in SHARED_METRICS if name not in row]
        assert not missing, f"{backend} lacks {missing}; it logs {sorted(row)}"
        assert 0.0 <= row["episodes/masked_fraction"] <= 1.0 and row["timing/step_s"] > 0
        assert row["lr"] > 0 and (row["grad_norm"] or 0.0) >= 0
