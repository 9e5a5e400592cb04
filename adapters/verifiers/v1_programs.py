"""Agents on a verifiers *program* harness (``bash`` and the like), run on verifiers' ``subprocess`` runtime.

A program harness runs the agent as a program (a PEP 723 ``uv`` script) beside the episode; its model
calls go through verifiers' interception server to our per-episode endpoint (``v1_endpoint``, reached
in-process through ``v1_relay``), so every call is answered by the backend's engine and
recorded with its sampled ids, as an agent on the in-process seat is. What the seat does in-process,
verifiers does here with its own program, its own tools (``bash``, ``edit``) and its own runtime.

The rule (``runtime_for``): a harness that needs no container (``NEEDS_CONTAINER = False``) runs on
the ``subprocess`` runtime unless ``env_args.<seat>.runtime`` names another. verifiers' default
runtime is a remote sandbox, which needs an account and a network a training node rarely has, and a
program that needs no container loses nothing on the local runtime; a runtime you name is used as
named. A harness that needs a container is refused in one sentence (no container runtime runs here).

Before the first rollout (``check_program``): ``uv`` on PATH and the program's script dependencies
installed by verifiers' own preparation on a subprocess runtime, once per harness per process; either
missing is one sentence, not a masked batch.
"""

from __future__ import annotations

import asyncio
import shutil
from typing import Any

from bridges.runtime.asyncutils import describe_exception, run_sync
from bridges.runtime.errors import ConfigError

# what a program harness adds to the prompt beyond the task's, in tokens of any tokenizer: verifiers' bash
# harness adds its system prompt and the bash and edit tool schemas, ~1.4k ASCII characters (~300 tokens
# under Qwen2.5's template, ~1.1k under a character-level one); no tokenizer spends more than a token on
# an ASCII character, so characters bound tokens, with room for larger harnesses
PROGRAM_PROMPT_TOKENS = 3072
PREPARE_TIMEOUT_S = 600.0  # uv resolves and installs the script's dependencies the first time
_PREPARED: set[str] = set()  # harness ids whose program this process has prepared


def runtime_for(seat: dict[str, Any]) -> dict[str, Any]:
    """The seat's env_args with the runtime a program harness runs on (the rule above)."""
    return {**seat, "runtime": seat.get("runtime") or {"type": "subprocess"}}


def check_program(taskset_id: str, seat: str, harness: Any, harness_config: Any) -> None:
    """``uv`` is there and the program of ``harness`` (a ``Harness`` class) is prepared, or one sentence."""
    who = f"agent '{seat}' of the verifiers v1 taskset '{taskset_id}' runs the '{harness_config.id}' harness"
    if shutil.which("uv") is None:
        raise ConfigError(f"{who}, a uv script on verifiers' subprocess runtime, and uv is not on PATH: pip install "
                          f"uv (or set env_args.{seat}.harness.id=null to run it as a chat agent).")
    if harness_config.id in _PREPARED:
        return
    try:
        run_sync(asyncio.wait_for(_prepare(harness(harness_config)), PREPARE_TIMEOUT_S))
    except Exception as exc:  # uv's own failure: no index, a dependency that does not resolve
        raise ConfigError(f"{who}, and its program could not be prepared on verifiers' subprocess runtime "
                          f"({describe_exception(exc)[:300]}): uv must be able to install its script's "
                          "dependencies from the package index.") from None
    _PREPARED.add(harness_config.id)


async def _prepare(harness: Any) -> None:
    """verifiers' own preparation of the program (``Harness.setup``) on a fresh subprocess runtime."""
    from verifiers.v1.runtimes.subprocess import SubprocessConfig, SubprocessRuntime

    runtime = SubprocessRuntime(SubprocessConfig())
    await runtime.start()
    try:
        await harness.setup(runtime)
    finally:
        await runtime.stop()
