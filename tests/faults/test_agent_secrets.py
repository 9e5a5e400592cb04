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


def test_password_credential_and_private_names_are_secrets_too():
    names = ["LC_PASSWORD", "DB_PASSWD", "SMTP_PASS", "GOOGLE_APPLICATION_CREDENTIALS", "SSH_PRIVATE_KEY_PATH",
             "MY_PRIVATE"]
    assert all(is_secret(n) for n in names), [n for n in names if not is_secret(n)]
    assert not any(is_secret(n) for n in ("PASSAGE_COUNT", "LANG", "COMPASS_HOME"))


# the agent: every ancestor's environ and mem, then every process /proc shows it; prints what it could read
WALKS_ITS_ANCESTORS = textwrap.dedent("""
    import os, re, sys
    sys.stdin.read()
    if "OPENAI_BASE_URL" in os.environ:  # under a rollout: one call, so there is something to train on
        from openai import OpenAI
        OpenAI().chat.completions.create(model="any", messages=[{"role": "user", "content": "hi"}])
    read, pid, seen = [], os.getpid(), set()
    while pid and pid not in seen:
        seen.add(pid)
        for part in ("environ", "mem"):
            try:
                with open(f"/proc/{pid}/{part}", "rb") as handle:
                    read.append(handle.read(1 << 20))
            except OSError:
                pass
        with open(f"/proc/{pid}/status") as status:
            pid = int(re.search(r"PPid:\\s+(\\d+)", status.read()).group(1))
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as handle:
                    read.append(handle.read())
            except OSError:
                pass
    print(f"ancestors={len(seen)} read={len(read)}")
    sys.stdout.buffer.write(b"\\n".join(read).replace(b"\\0", b"\\n"))
""")

# the trainer: started with the secrets in its environment (/proc/<pid>/environ shows a process's starting
# environment, so they must be there from its start), runs one rollout of the agent above
TRAINER = textwrap.dedent("""
    import asyncio, sys
    from bridges import AgentEnv, Rubric
    from bridges.adapters.hf import HFEngine
    from bridges.client import EngineClient
    from bridges.models.tiny import tiny_model_path

    async def main():
        client = EngineClient(HFEngine.from_pretrained(str(tiny_model_path())), model_name="tiny")
        env = AgentEnv(command=[sys.executable, "-c", sys.argv[1]], rubric=Rubric(funcs=[lambda state: 1.0]))
        (state,) = await env.run_group({"question": "q", "answer": "a"}, client, "tiny", 1, {"max_tokens": 4})
        print(state["agent"].output)
        print(f"error={state.error}")

    asyncio.run(main())
""")


def test_a_command_agent_cannot_read_any_ancestors_environment_or_memory(tmp_path: Any):
    import subprocess

    secrets = {"OPENAI_API_KEY": "sk-parent-openai", "HF_TOKEN": "hf_parent", "BRIDGES_API_KEY": "bridges-parent",
               "AWS_SECRET_ACCESS_KEY": "aws-parent", "WANDB_API_KEY": "wandb-parent", "LC_PASSWORD": "lc-parent"}
    # a shell that holds the secrets too, as the user's would, between this test and the trainer
    done = subprocess.run(["sh", "-c", 'exec "$0" -c "$1" "$2"', sys.executable, TRAINER, WALKS_ITS_ANCESTORS],
                          env={**os.environ, **secrets}, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert "error=None" in out and "OPENAI_BASE_URL=" in out  # it ran, and read its own environment
    assert "ancestors=" in out and int(out.split("ancestors=")[1].split()[0]) >= 1
    leaked = sorted(name for name, value in secrets.items() if value in out)
    assert not leaked, f"the agent read {leaked} from a process that started it"
    # the control: the same walk, started by that shell without the trainer's launcher, reads them all
    bare = subprocess.run(["sh", "-c", 'echo | "$0" -c "$1"', sys.executable, WALKS_ITS_ANCESTORS],
                          env={**os.environ, **secrets}, capture_output=True, text=True, timeout=60, check=False)
    assert all(value in bare.stdout for value in secrets.values())
