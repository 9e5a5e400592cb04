"""``engine=openai`` against a real OpenAI-compatible HTTP endpoint: the tiny model served by ``bridges.serve``.

A remote endpoint returns no token ids the policy can be trained on, so its results must say so
(``token_ids: false``, "evaluation only" in the table), and the API key read from the environment
must never reach the saved metadata.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bridges.eval import main


def test_openai_engine_on_a_served_endpoint_is_labelled_evaluation_only(
    hf_engine: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from bridges.client import EngineClient
    from bridges.server.app import serve_in_thread

    monkeypatch.setenv("BRIDGES_TEST_ENDPOINT_KEY", "s3cret-key")
    with serve_in_thread(EngineClient(hf_engine, model_name="tiny"), api_key="s3cret-key") as server:
        argv = [
            "env=repeat_letter",
            "engine=openai",
            "model=tiny",
            f"base_url={server.base_url}",
            "api_key_var=BRIDGES_TEST_ENDPOINT_KEY",
            "num_examples=3",
            "rollouts_per_example=2",
            f"output={tmp_path}",
            "progress=false",
        ]
        assert main(argv) == 0
        served = hf_engine.stats.requests
        assert served >= 3  # the rollouts really went through the HTTP endpoint to the engine
        assert main(argv) == 0  # a second run resumes: the endpoint is not asked again
        assert hf_engine.stats.requests == served

    out = capsys.readouterr().out
    assert "evaluation only" in out and "6 rows resumed" in out
    saved = (tmp_path / "metadata.json").read_text()
    metadata = json.loads(saved)
    assert metadata["token_ids"] is False and metadata["engine"] == "openai"
    assert metadata["base_url"] == server.base_url
    assert "s3cret-key" not in saved
    records = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert len(records) == 6 and all(r["error"] is None for r in records)
    # repeat_letter's dense reward: a fraction of 6 characters, so a multiple of 1/6 in [0, 1]
    assert all(0.0 <= r["reward"] <= 1.0 and round(r["reward"] * 6, 6).is_integer() for r in records)
