"""verifiers' own evaluation of a v1 taskset, for equivalence tests: the reference rl-bridges must match.

Everything is verifiers' as it ships: ``load_environment``, ``Env.serving``/``run_slot``, the null
harness *program* (one process per agent run, in the ``subprocess`` runtime), its ``EvalClient``, its
interception server, hooks and scoring. The one substitution is how the program starts: verifiers
prepares it with ``uv sync --script`` (which needs uv and the package index); here it is started with
this Python, whose environment already holds what the program imports.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

KEY_VAR = "BRIDGES_TEST_VF_REFERENCE_KEY"


@contextlib.contextmanager
def programs_run_with_this_python(folder: Path) -> Iterator[None]:
    """verifiers' harness programs start as ``python <script>`` instead of through uv."""
    from verifiers.v1.runtimes.base import Runtime

    original = Runtime.prepare_uv_script

    async def prepare(self: Any, script: str | bytes, env: Any = None, *, activate: bool = True) -> list[str]:
        data = script.encode() if isinstance(script, str) else script
        path = folder / f"{hashlib.sha256(data).hexdigest()}.py"
        path.write_bytes(data)
        return [sys.executable, str(path)]

    Runtime.prepare_uv_script = prepare  # type: ignore[method-assign]
    try:
        yield
    finally:
        Runtime.prepare_uv_script = original  # type: ignore[method-assign]


def offline_config(taskset_id: str, env_args: dict[str, Any], harness: str | None = "null") -> Any:
    """The run config verifiers' docs give for an offline run: every agent on the null harness (or, with
    ``harness=None``, on the taskset's own) in the subprocess runtime (the defaults are a remote sandbox)."""
    from verifiers.v1.configs.agent import AgentConfig
    from verifiers.v1.utils.loaders import resolve_env_config

    data = {**env_args, "taskset": {**env_args.get("taskset", {}), "id": taskset_id}}
    config = resolve_env_config(data)
    for name in type(config).model_fields:
        if isinstance(getattr(config, name), AgentConfig):
            pinned = {"harness": {"id": harness}} if harness is not None else {}
            data[name] = {**data.get(name, {}), **pinned, "runtime": {"type": "subprocess"}}
    return resolve_env_config(data)


async def verifiers_own_results(
    taskset_id: str, env_args: dict[str, Any], base_url: str, model: str, sampling: dict[str, Any],
    harness: str | None = "null",
) -> dict[tuple[int, str], tuple[float, str]]:
    """(task index, agent) -> (reward, last reply) of each agent's first trace, one episode per task."""
    from verifiers.v1.clients import ModelContext
    from verifiers.v1.configs.client import EvalClientConfig
    from verifiers.v1.env import RunSlot
    from verifiers.v1.types import SamplingConfig
    from verifiers.v1.utils.loaders import load_environment

    env = load_environment(offline_config(taskset_id, env_args, harness))
    os.environ[KEY_VAR] = "unused"
    ctx = ModelContext(model, EvalClientConfig(base_url=base_url, api_key_var=KEY_VAR), SamplingConfig(**sampling))
    results: dict[tuple[int, str], tuple[float, str]] = {}
    async with env.serving():
        for index, task in enumerate(env.taskset):
            episode = await env.run_slot(RunSlot(task), ctx)
            assert not episode.errors, episode.errors
            for trace in episode.traces:
                assert not trace.errors, trace.errors
                results.setdefault((index, trace.agent.name), (trace.reward, trace.last_reply))
    return results
