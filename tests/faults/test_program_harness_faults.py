"""A verifiers program harness that fails (issue 41, item 4): its program killed, hung past its deadline,
looping on calls, or leaving children, is a masked rollout with its reason, its process tree gone, and
the next rollout goes on; a machine without ``uv`` or its index is one sentence before any rollout."""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from process_marks import processes_marked
from scripted_engine import ScriptedEngine, bash_script

from bridges.envs.registry import load_environment
from bridges.runtime.errors import ConfigError
from bridges.workflows.rollouts import run_group

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
pytestmark = pytest.mark.skipif(shutil.which("uv") is None, reason="uv is in the dev extra; verifiers' programs need it")


@pytest.fixture(autouse=True)
def _fixtures_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(FIXTURES))


def runs(command: str) -> Any:
    """A coding agent that runs ``command`` with the bash tool, then replies with its output."""

    def script(prompt: str) -> str:
        if "<tool_response>" in prompt:
            return "done"
        return f'<tool_call>\n{{"name": "bash", "arguments": {json.dumps({"command": command})}}}\n</tool_call>'

    return script


def never_stops(prompt: str) -> str:
    return '<tool_call>\n{"name": "bash", "arguments": {"command": "true"}}\n</tool_call>'


async def rollout(qwen_tokenizer: Any, script: Any, episode_s: int = 60) -> Any:
    from bridges.client import EngineClient

    env = load_environment("vf_v1_bash_taskset", taskset={"num_tasks": 1}, timeout={"episode": episode_s})
    client = EngineClient(ScriptedEngine(qwen_tokenizer, script), model_name="scripted")
    (row,) = env.get_dataset()
    return (await run_group(env, dict(row), client, 1, {"max_tokens": 64}, model="scripted")).states[0]


def gone(marker: str, within_s: float = 20.0) -> bool:
    deadline = time.monotonic() + within_s
    while processes_marked(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not processes_marked(marker)


@pytest.mark.slow
async def test_a_program_that_hangs_or_leaves_children_is_masked_and_its_tree_is_gone(
    qwen_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
):
    marker = f"BRIDGES_TEST_PROGRAM={uuid.uuid4().hex}"
    monkeypatch.setenv(*marker.split("="))  # the program and what it starts inherit it
    hung = await rollout(qwen_tokenizer, runs("sleep 600 & sleep 600"), episode_s=8)
    assert hung.stop_reason == "timeout" and not hung.trainable and "deadline" in (hung.error or ""), hung.error
    assert gone(marker), processes_marked(marker)
    after = await rollout(qwen_tokenizer, bash_script)  # the run goes on
    assert after.error is None and after.stop_reason == "completed"


@pytest.mark.slow
async def test_a_program_killed_mid_episode_or_looping_is_a_masked_rollout(qwen_tokenizer: Any):
    killed = await rollout(qwen_tokenizer, runs("kill -9 $PPID"))
    assert killed.stop_reason in ("env_error", "timeout") and not killed.trainable and killed.error, killed
    looping = await rollout(qwen_tokenizer, never_stops, episode_s=30)
    assert not looping.trainable and looping.error, looping.stop_reason


def test_no_uv_is_one_sentence_before_any_rollout(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PATH", os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                                               if not (Path(p) / "uv").exists()))
    with pytest.raises(ConfigError) as refused:
        load_environment("vf_v1_bash_taskset")
    assert str(refused.value) == (
        "agent 'agent' of the verifiers v1 taskset 'vf_v1_bash_taskset' runs the 'bash' harness, a uv script on "
        "verifiers' subprocess runtime, and uv is not on PATH: pip install uv (or set env_args.agent.harness.id=null "
        "to run it as a chat agent)."
    )


def test_a_program_uv_cannot_prepare_is_one_sentence_before_any_rollout(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    """uv fails to install the script's dependencies (an index it cannot reach): the run stops at load.
    The failure is uv's, made at its one seam: a ``uv`` first on PATH that answers ``--help`` as the real
    one does (verifiers checks its version that way) and fails every sync as an unreachable index does."""
    from bridges.adapters.verifiers import v1_programs

    real = shutil.which("uv")
    shim = tmp_path / "uv"
    shim.write_text(f'#!/bin/sh\ncase "$*" in *--help*) exec {real} "$@";; esac\n'
                    'echo "error: Failed to fetch: https://pypi.org/simple/openai/ (index unreachable)" >&2\nexit 2\n')
    shim.chmod(0o755)
    from verifiers.v1.runtimes.subprocess import SubprocessRuntime

    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(v1_programs, "_PREPARED", set())
    monkeypatch.setattr(SubprocessRuntime, "_interpreters", {})  # verifiers' per-process cache of prepared scripts
    with pytest.raises(ConfigError, match=r"its program could not be prepared on verifiers' subprocess runtime .*"
                                          r"index unreachable.*uv must be able to install its script's dependencies"):
        load_environment("vf_v1_bash_taskset")
