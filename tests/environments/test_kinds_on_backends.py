"""The multi-turn and tool kinds of the default task train on every backend: two steps each on grpo, TRL
and Tinker (the reduced curve run of ``benchmarks/kinds_on_backends.py``), and verl's real agent-loop
worker, with each model turn capped by the environment and the sampled ids trained. The agent and v1
kinds have the same on every backend in ``tests/agents/test_agent_backends.py`` and
``tests/adapters/test_verifiers_v1_backends.py``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from trace_files import run_traces

SMALL = ["progress=false", "trainer.max_steps=2", "trainer.batch_size=2", "trainer.group_size=8", "run_name=kind"]
KINDS = {"turns": "repeat_letter_turns", "tool": "repeat_letter_tool"}


def _rows(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]


def _check_trace(kind: str, trace: dict[str, Any]) -> None:
    turns, completion = trace["turns"], trace["completion"]
    assert 1 <= len(turns) <= (3 if kind == "turns" else 2) and all(0 < len(t["completion_ids"]) <= 6 for t in turns)
    roles = [m["role"] for m in completion]
    if kind == "turns":  # each reply but the last answered with its score
        assert roles == ["assistant", "user"] * (len(turns) - 1) + ["assistant"]
        assert all(m["content"].endswith("/6") for m in completion[1::2])
    else:  # a reply that called the tool is answered with the letter; one that did not ends the episode
        assert roles in (["assistant"], ["assistant", "tool", "assistant"])
        assert (len(turns) == 2) == bool(completion[0].get("tool_calls"))


@pytest.mark.parametrize("backend", ["grpo", "trl", "tinker"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_two_steps_of_each_kind_on_each_in_process_backend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, backend: str
) -> None:
    from bridges.train import main

    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    extra = ["tinker.base_url=local"] if backend == "tinker" else []
    assert main([f"backend={backend}", f"env={KINDS[kind]}", f"output_dir={tmp_path}", *SMALL, *extra]) == 0
    rows = _rows(tmp_path / "kind")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["episodes/total"] == 16 and r["episodes/masked_fraction"] == 0.0 for r in rows)
    assert all(0.0 <= r["reward/mean"] <= 1.0 for r in rows)
    if backend == "trl":  # TRL keeps no traces file; its rows carry the environment's metrics
        assert all(1.0 <= r["env/num_turns"] <= (3.0 if kind == "turns" else 2.0) for r in rows)
        return
    assert all(r["samples/breaks"] == 0 for r in rows)  # one ledger an episode: one sample
    traces = run_traces(tmp_path / "kind")
    assert len(traces) == 32
    for trace in traces:
        _check_trace(kind, trace)


@pytest.mark.parametrize("kind", list(KINDS))
def test_verls_agent_loop_worker_runs_each_kind_on_the_sampled_ids(
    tmp_path: Path, tiny_path: Path, tiny_tokenizer: Any, kind: str
) -> None:
    from recording_server import RecordingServer
    from verl_harness import N, batch_of, compose, rows_of, run_worker

    cfg, files = compose(tmp_path, tiny_path, "", env=KINDS[kind])
    client = RecordingServer(str(tiny_path))
    rows = rows_of(run_worker(cfg, batch_of(cfg, files, tiny_tokenizer), client), cfg)
    assert len(rows) == 2 * N and client.max_tokens and max(client.max_tokens) == 6  # the env's turn cap
    sampled = {tuple(ids) for turns in client.sampled.values() for ids, _ in turns}
    for row in rows:
        assert row["valid"] and row["stop"] in ("completed", "solved", "max_turns")
        assert 0.0 <= row["reward"] <= 1.0
        runs: list[list[int]] = [[]]  # the response's trained stretches: each one model turn's sampled ids
        for token, trained in zip(row["response"], row["mask"], strict=True):
            if trained:
                runs[-1].append(token)
            elif runs[-1]:
                runs.append([])
        turns = [tuple(run) for run in runs if run]
        assert turns and all(turn in sampled for turn in turns)
