"""Attack: the agent being trained reads the trainer's secrets from its environment.

Before, a command agent started with ``{**os.environ, ...}``: the weight and API keys of every server
the README tells users to export, HF and W&B tokens, and the verifiers endpoint's secret. Now it gets
an allowlisted environment, the session's four variables, and what its author names."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from typing import Any

import pytest

from bridges import AgentEnv, Rubric
from bridges.agents.agent_run import Endpoint, agent_environment, is_secret

PRINTS_ITS_ENVIRONMENT = textwrap.dedent("""
    import json, os, sys
    from openai import OpenAI
    json.load(sys.stdin)
    client = OpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ["OPENAI_API_KEY"])
    client.chat.completions.create(model="any", messages=[{"role": "user", "content": "hi"}])
    print(json.dumps(dict(os.environ)))
""")

SECRETS = {
    "BRIDGES_SERVER_WEIGHTS_KEY": "w-secret", "BRIDGES_SERVER_API_KEY": "a-secret",
    "BRIDGES_V1_ENDPOINT_7f": "v1-secret", "HF_TOKEN": "hf_x", "WANDB_API_KEY": "wb", "MY_CLIENT_SECRET": "s",
    "AWS_SECRET_ACCESS_KEY": "aws", "UNRELATED_SETTING": "not a program's need",
}


async def test_a_command_agent_sees_no_secret_unless_its_author_names_it(
    scripted: Any, monkeypatch: pytest.MonkeyPatch
):
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    client, _ = scripted()
    env = AgentEnv(
        command=[sys.executable, "-c", PRINTS_ITS_ENVIRONMENT], rubric=Rubric(funcs=[lambda state: 1.0]),
        command_env={"TASK_MODE": "hard"}, command_inherit=["HF_TOKEN", "NOT_SET_ANYWHERE"],
    )
    (state,) = await env.run_group({"question": "q", "answer": "a"}, client, "policy", 1, {"max_tokens": 8})
    assert state.error is None, state.error
    seen = json.loads(state["agent"].output.strip().splitlines()[-1])
    leaked = sorted(set(SECRETS) & set(seen) - {"HF_TOKEN"})
    assert not leaked, f"the agent saw {leaked}"
    assert seen["HF_TOKEN"] == "hf_x" and seen["TASK_MODE"] == "hard" and "NOT_SET_ANYWHERE" not in seen
    assert seen["PATH"] == os.environ["PATH"]  # what a program needs to run is still there
    assert seen["OPENAI_API_KEY"] == seen["ANTHROPIC_API_KEY"] and seen["OPENAI_BASE_URL"].endswith("/v1")
    assert seen["OPENAI_API_KEY"] not in SECRETS.values()


def test_the_session_variables_win_over_anything_the_author_sets(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    at = Endpoint("http://127.0.0.1:1/s/x/v1", "http://127.0.0.1:1/s/x", "session-key")
    env = agent_environment(at, {"OPENAI_API_KEY": "stolen", "OPENAI_BASE_URL": "http://evil"}, ["LC_ALL"])
    assert env["OPENAI_API_KEY"] == "session-key" and env["OPENAI_BASE_URL"] == at.base_url
    assert env["LC_ALL"] == "C.UTF-8"
    assert [n for n in ("BRIDGES_X", "OPENAI_API_KEY", "GH_TOKEN", "db_secret_path") if is_secret(n)] == [
        "BRIDGES_X", "OPENAI_API_KEY", "GH_TOKEN", "db_secret_path",
    ]
    assert not any(is_secret(n) for n in ("PATH", "HOME", "KEYBOARD", "TOKENIZERS_PARALLELISM"))
