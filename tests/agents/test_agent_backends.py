"""An agent in its own code trains on every backend and evaluates with ``bridges.eval``: the bundled
``repeat_letter_agent`` (plain OpenAI SDK code, two calls per rollout) on grpo, TRL, Tinker and verl's
real agent-loop worker, and the OpenAI Agents SDK example on grpo over a real BPE vocabulary."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from trace_files import run_traces

SMALL = ["env=repeat_letter_agent", "progress=false", "trainer.max_steps=2", "trainer.batch_size=2",
         "trainer.group_size=4", "run_name=agent"]
AGENT_EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "agents"


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _extends(turns: list[dict[str, Any]]) -> bool:
    """The second call's prompt starts with the first call's prompt and sampled ids, token for token."""
    first, second = turns
    head = first["prompt_ids"] + first["completion_ids"]
    return second["prompt_ids"][: len(head)] == head


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["grpo", "trl", "tinker"])
def test_an_agent_in_its_own_code_trains_two_steps_on_each_in_process_backend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str
):
    from bridges.train import main

    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    extra = ["tinker.base_url=local"] if backend == "tinker" else []
    assert main([f"backend={backend}", f"output_dir={tmp_path}", *SMALL, *extra]) == 0
    rows = _lines(tmp_path / "agent" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["episodes/total"] == 8 and r["episodes/masked_fraction"] == 0.0 for r in rows)
    if backend == "trl":  # TRL keeps no traces file; its rows carry the environment's metrics
        assert all(r["env/agent/calls"] == 2.0 and r["env/num_turns"] == 2.0 for r in rows)
        return
    assert all(r["samples/breaks"] == 0 for r in rows)
    traces = run_traces(tmp_path / "agent")
    assert len(traces) == 16
    for trace in traces:
        assert trace["stop_reason"] == "completed" and len(trace["turns"]) == 2 and _extends(trace["turns"])
        assert [m["role"] for m in trace["completion"]] == ["assistant", "user", "assistant"]


def test_verls_agent_loop_worker_trains_on_the_agents_sampled_ids(tmp_path: Path, tiny_path: Path, tiny_tokenizer: Any):
    from recording_server import RecordingServer
    from verl_harness import N, batch_of, compose, rows_of, run_worker

    cfg, files = compose(tmp_path, tiny_path, "", env="repeat_letter_agent")
    client = RecordingServer(str(tiny_path))
    rows = rows_of(run_worker(cfg, batch_of(cfg, files, tiny_tokenizer), client), cfg)
    assert len(rows) == 2 * N
    sampled = sorted(ids for turns in client.sampled.values() for ids, _ in turns)
    assert len(sampled) == 2 * len(rows)  # two calls per rollout, each recorded by verl's server
    for row in rows:  # one response: the first call's ids, the env's masked turn, the second call's ids
        assert row["valid"] and row["stop"] == "completed"
        response = list(row["response"])
        assert any(
            response[: len(a)] == list(a) and response[len(response) - len(b) :] == list(b)
            and sum(row["mask"]) == len(a) + len(b)
            for a in sampled for b in sampled
        )


def test_bridges_eval_runs_an_agent_as_a_command_and_scores_it(tmp_path: Path):
    out = tmp_path / "eval"
    done = subprocess.run(
        [sys.executable, "-m", "bridges.eval", "env=repeat_letter_agent", "env_args.command=true", "model=tiny",
         "num_examples=2", "rollouts_per_example=2", "progress=false", f"output={out}"],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = _lines(out / "results.jsonl")
    assert len(rows) == 4
    for row in rows:
        assert row["stop_reason"] == "completed" and len(row["turns"]) == 2 and _extends(row["turns"])
        agent = json.loads(row["extras"])["agent"]
        assert agent["exit_code"] == 0 and agent["output"].strip() == row["completion"][-1]["content"].strip()


@pytest.mark.slow
def test_the_openai_agents_sdk_example_trains_on_a_real_bpe_vocabulary_with_the_sampled_ids(tmp_path: Path):
    done = subprocess.run(
        [sys.executable, "-m", "bridges.train", "env=letter_agents", "env_args.framework=openai-agents",
         "model=tiny-qwen2.5", "trainer.max_steps=2", "trainer.batch_size=2", "trainer.group_size=4",
         "progress=false", f"output_dir={tmp_path}", "run_name=sdk"],
        cwd=AGENT_EXAMPLES, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = _lines(tmp_path / "sdk" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["samples/breaks"] == 0 and r["drift/tokens"] == 0 and r["samples/trained"] > 0 for r in rows)
    for trace in run_traces(tmp_path / "sdk"):
        assert trace["turns"] and all(len(t["completion_ids"]) == len(t["logprobs"]) > 0 for t in trace["turns"])
        if trace["stop_reason"] != "completed":  # a random model's garbled tool name: the SDK refuses it
            assert trace["error"].startswith("the agent raised ModelBehaviorError: Tool ")
