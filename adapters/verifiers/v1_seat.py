"""An agent seat on verifiers' ``null`` harness, run in this process instead of one program per rollout.

verifiers' ``null`` harness is a plain chat loop shipped as a script it starts once per agent rollout
(through ``uv`` in 0.4, which needs ``uv`` and the package index). This harness keeps its contract —
the task's system prompt and prompt, chat calls against the rollout's interception endpoint with the
rollout's secret, until a reply calls no tool — and runs it as a coroutine, so verifiers' interception
server, hooks, trace and scoring see the same calls without a process per rollout. MCP toolsets are
not run here yet: a taskset that declares one is refused before any rollout.

verifiers resolves harnesses by module name only (``harness.id``), so ``register`` makes this module
importable as ``verifiers.v1.harnesses.bridges_seat``, and agents on ``null`` are pointed at it.
"""

from __future__ import annotations

import sys
from typing import Any

from openai import AsyncOpenAI

from bridges.runtime.errors import require_extra

require_extra("verifiers", "verifiers", "verifiers v1 tasksets")  # one sentence when it is missing
import verifiers.v1 as vf  # noqa: E402
from verifiers.v1.dialects.chat import message_to_wire  # noqa: E402

SEAT_ID = "bridges_seat"
MAX_CALLS = 64  # chat calls per agent rollout; the endpoint caps a session as well


# one HTTP client per event loop: building one builds a TLS context (~40 ms)
_http_clients: dict[int, Any] = {}


def _http_client() -> Any:
    import asyncio

    import openai

    key = id(asyncio.get_running_loop())
    if key not in _http_clients:
        _http_clients[key] = openai.DefaultAsyncHttpxClient()
    return _http_clients[key]


async def close_http_clients() -> None:
    """Close the seat's HTTP client of the running loop (when its serving resources close)."""
    import asyncio

    client = _http_clients.pop(id(asyncio.get_running_loop()), None)
    if client is not None:
        await client.aclose()


def register() -> None:
    """Make ``harness.id=bridges_seat`` resolve to this module in verifiers' loader."""
    sys.modules.setdefault(f"verifiers.v1.harnesses.{SEAT_ID}", sys.modules[__name__])


class InProcessChatConfig(vf.HarnessConfig):
    pass


class InProcessChatHarness(vf.Harness[InProcessChatConfig]):
    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_MCP = False
    NEEDS_CONTAINER = False
    EXECUTES_CODE = False

    async def launch(self, ctx: Any, trace: Any, runtime: Any, endpoint: str, secret: str,
                     mcp_urls: dict[str, str], data: Any) -> Any:  # fmt: skip
        """The null program's loop: chat until a reply calls no tool (this seat declares none)."""
        system, prompt = self.resolve_prompt(data)
        messages: list[Any] = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        elif prompt is not None:
            messages.extend(message_to_wire(m) for m in prompt)
        client = AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0, http_client=_http_client())
        for _ in range(MAX_CALLS):
            completion = await client.chat.completions.create(model=ctx.model, messages=messages)
            message = completion.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                break
            for call in message.tool_calls:
                unknown = (
                    f"error: unknown tool {call.function.name!r}" if call.type == "function" else "error"
                )
                messages.append({"role": "tool", "tool_call_id": call.id, "content": unknown})
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")


__all__ = ["InProcessChatHarness"]
