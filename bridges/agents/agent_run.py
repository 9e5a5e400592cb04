"""Running the user's agent against its rollout's session, bounded, and saying how it ended.

Two shapes of agent. An async callable ``agent(base_url, api_key, row)`` runs in the rollout's own
event loop under ``asyncio.timeout``: cheap, and the usual way to wrap an agent written with an SDK.
A command runs as a child process in a process group of its own, with ``OPENAI_BASE_URL``,
``OPENAI_API_KEY``, ``ANTHROPIC_BASE_URL`` and ``ANTHROPIC_API_KEY`` pointing at the session and the
row as JSON on stdin, and an environment of its own (``agent_environment``): the agent being trained is
untrusted code by nature, so it sees what a program needs to run and what the environment's author
names, never the trainer's keys and tokens. Nor can it read them where they live: it runs in PID and
mount namespaces of its own (``bridges.runtime.isolate``), so ``/proc`` shows it no ancestor, neither
the trainer's ``environ`` and ``mem`` nor those of the shell that exported the keys. Where the kernel
refuses namespaces it runs directly, the trainer marks itself non-dumpable (its own environment and
memory then unreadable to the agent unless it is root; py-spy needs root to attach), and says so once. Whatever happens — it exits, fails, outlives its deadline, or the rollout is
cancelled — the whole group is killed before this returns, so nothing the agent started outlives
its rollout (a grandchild that made a session of its own escapes; ``die_with_parent`` still ends
the child itself if this process dies).

Limit: an async agent that blocks the event loop (``time.sleep``, a CPU loop without an await) cannot
be interrupted here; run such an agent as a command.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from bridges.runtime.asyncutils import describe_exception
from bridges.runtime.launch import die_with_parent

OUTPUT_TAIL_BYTES = 16 * 1024  # what is kept of a command's output (stdout and stderr, interleaved)

AgentCallable = Callable[[str, str, dict[str, Any]], Awaitable[Any]]


@dataclass(frozen=True)
class AgentOutcome:
    """How the agent's run ended; the rubric reads it as ``state["agent"]``."""

    result: Any = None  # what an async agent returned
    exit_code: int | None = None  # a command's exit status (negative: killed by that signal)
    output: str = ""  # the tail of a command's stdout and stderr
    error: str | None = None  # one sentence when the run failed: the rollout is masked with it
    timed_out: bool = False

    def model_dump(self) -> dict[str, Any]:
        """Its fields, for the trace writer (which turns what JSON cannot hold into text)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class Endpoint:
    """Where the agent's model lives for this rollout."""

    base_url: str  # OpenAI style, ending in /v1
    anthropic_url: str  # Anthropic's SDK appends /v1/messages itself
    api_key: str


async def run_callable(agent: AgentCallable, at: Endpoint, row: dict[str, Any], timeout: float) -> AgentOutcome:
    try:
        async with asyncio.timeout(timeout):
            result = await agent(at.base_url, at.api_key, row)
    except TimeoutError:
        return AgentOutcome(error=f"the agent did not finish within agent_timeout={timeout} s.", timed_out=True)
    except Exception as exc:  # the user's agent failed: the rollout is masked with its one line
        return AgentOutcome(error=f"the agent raised {describe_exception(exc)}")
    return AgentOutcome(result=result)


# what a program needs to run, taken from this process's environment; nothing else is inherited
INHERITED = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TERM", "TZ", "TMPDIR", "TMP", "TEMP",
    "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "CONDA_PREFIX", "LD_LIBRARY_PATH", "SSL_CERT_FILE",
    "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "NO_PROXY", "no_proxy", "SYSTEMROOT", "COMSPEC",
})


def is_secret(name: str) -> bool:
    """A name that holds (or unlocks) a credential: ours (``BRIDGES_*``), keys, tokens, secrets, passwords
    (``*PASSWORD*``, ``*PASS``, ``*PASSWD*``), credentials and private keys."""
    upper = name.upper()
    return (upper.startswith("BRIDGES_") or upper.endswith(("_KEY", "_TOKEN", "PASS"))
            or any(word in upper for word in ("SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "PRIVATE")))


def agent_environment(at: Endpoint, extra: Mapping[str, str], inherit: Sequence[str] = ()) -> dict[str, str]:
    """The command agent's whole environment: ``INHERITED`` and the ``LC_*`` locale (never a secret),
    the names the author lists in ``inherit`` (copied from this process, secret or not: named on
    purpose), ``extra`` as given, then the session's four variables, which nothing overrides."""
    own = {k: v for k, v in os.environ.items() if (k in INHERITED or k.startswith("LC_")) and not is_secret(k)}
    named = {k: os.environ[k] for k in inherit if k in os.environ}
    return {**own, **named, **extra, "OPENAI_BASE_URL": at.base_url, "OPENAI_API_KEY": at.api_key,
            "ANTHROPIC_BASE_URL": at.anthropic_url, "ANTHROPIC_API_KEY": at.api_key}


async def run_command(
    argv: Sequence[str], at: Endpoint, row: dict[str, Any], timeout: float, env: Mapping[str, str],
    inherit: Sequence[str] = (),
) -> AgentOutcome:
    """``argv`` with its own environment (``agent_environment``) and the row on stdin, bounded by ``timeout``,
    where it cannot see the processes that started it (``isolated_argv``)."""
    if shutil.which(argv[0]) is None:
        return AgentOutcome(error=f"the agent command {argv[0]!r} could not start: no such program.")
    try:
        process = await asyncio.create_subprocess_exec(
            *await isolated_argv(argv), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, env=agent_environment(at, env, inherit), preexec_fn=die_with_parent,
        )
    except OSError as exc:
        return AgentOutcome(error=f"the agent command {argv[0]!r} could not start: {describe_exception(exc)}")
    tail = bytearray()
    io = asyncio.gather(_feed(process, json.dumps(row, default=str).encode()), _keep_tail(process, tail))
    try:
        async with asyncio.timeout(timeout):
            await process.wait()
    except TimeoutError:
        return AgentOutcome(error=f"the agent did not finish within agent_timeout={timeout} s; its "
                            "processes were killed.", timed_out=True)
    finally:  # the group goes first: a child left holding the pipe would keep the reader waiting
        await _kill_group(process)
        with contextlib.suppress(Exception):
            await asyncio.shield(io)
    text = bytes(tail).decode(errors="replace")
    code = process.returncode
    if code != 0:
        last = text.strip().splitlines()[-1:] or ["no output"]
        return AgentOutcome(exit_code=code, output=text, error=f"the agent exited with code {code}: {last[0][:300]}")
    return AgentOutcome(exit_code=0, output=text)


async def isolated_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` behind the namespace launcher where this kernel allows it; else ``argv`` as it is, the
    trainer made non-dumpable, and one warning (the first time)."""
    from bridges.runtime import isolate

    if await asyncio.to_thread(isolate.available):
        return [sys.executable, "-m", "bridges.runtime.isolate", "--", *argv]
    if not _WARNED:
        _WARNED.append(True)
        isolate.mark_undumpable()
        print("warning: this kernel refuses PID and mount namespaces, so command agents run beside the trainer's "
              "processes: the trainer is now non-dumpable (its environment and memory unreadable to them unless "
              "they run as root), but the environments of its ancestors are not.", file=sys.stderr, flush=True)
    return list(argv)


_WARNED: list[bool] = []


async def _feed(process: asyncio.subprocess.Process, data: bytes) -> None:
    """The row on stdin, beside the reader (an agent that writes before it reads must not deadlock)."""
    assert process.stdin is not None
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        process.stdin.write(data)
        await process.stdin.drain()
    process.stdin.close()


async def _keep_tail(process: asyncio.subprocess.Process, tail: bytearray) -> None:
    """Read the output to its end, keeping only its last ``OUTPUT_TAIL_BYTES`` (an agent may flood it)."""
    assert process.stdout is not None
    while chunk := await process.stdout.read(65536):
        tail += chunk
        del tail[:-OUTPUT_TAIL_BYTES]


async def _kill_group(process: asyncio.subprocess.Process) -> None:
    """SIGKILL to the agent's process group (it leads one: ``die_with_parent`` made a session), then reap."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        await asyncio.shield(process.wait())
