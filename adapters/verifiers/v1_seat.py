"""An agent seat on verifiers' ``null`` harness, run in this process instead of one program per rollout.

verifiers' ``null`` harness is a plain chat loop shipped as a script it starts once per agent rollout
(through ``uv`` in 0.4, which needs ``uv`` and the package index). This harness keeps its contract —
the task's system prompt and prompt, chat calls against the rollout's interception endpoint with the
rollout's secret, until a reply calls no tool — and runs it as a coroutine, so verifiers' interception
server, hooks, trace and scoring see the same calls without a process per rollout. A later segment of
an exchange (``agent.interaction(task).turn(...)``, how multi-agent envs converse) is verifiers' own
``Harness.resume``: the loop again, on the conversation so far plus the new user turn. The task's MCP
toolsets, which verifiers starts per rollout, are offered and called as the null program does
(``v1_tools``).

verifiers resolves harnesses by module name only (``harness.id``), so ``register`` makes this module
importable as ``verifiers.v1.harnesses.bridges_seat``, and agents on ``null`` are pointed at it.
"""

from __future__ import annotations

import sys
from typing import Any

from pydantic_core import from_json, to_json

from bridges.adapters.verifiers.v1_tools import open_toolbox
from bridges.runtime.errors import require_extra

require_extra("verifiers", "verifiers", "verifiers v1 tasksets")  # one sentence when it is missing
import verifiers.v1 as vf  # noqa: E402
from verifiers.v1.dialects.chat import message_to_wire  # noqa: E402

SEAT_ID = "bridges_seat"
MAX_CALLS = 64  # chat calls per agent rollout; the endpoint caps a session as well


# one HTTP client per event loop, shared by every serving open in that loop: each serving holds it
# while open, and the last to close closes it. aiohttp's, not httpx's: httpx's pool checks every open
# connection on each request, and with rollouts in flight together that cost more than the call.
_http_clients: dict[int, tuple[Any, int]] = {}


def _http_client() -> Any:
    import asyncio

    return _http_clients[id(asyncio.get_running_loop())][0]


def hold_http_client() -> None:
    """A serving of the running loop opens: make the loop's client, or count one more holder."""
    import asyncio

    import aiohttp

    key = id(asyncio.get_running_loop())
    if key in _http_clients:
        client, holders = _http_clients[key]
    else:  # no bound on connections (the rollouts' own bound holds) or on time (the episode's holds)
        connector = aiohttp.TCPConnector(limit=0)
        client, holders = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout()), 0
    _http_clients[key] = (client, holders + 1)


async def release_http_client() -> None:
    """A serving of the running loop closes: the last holder closes the client."""
    import asyncio

    key = id(asyncio.get_running_loop())
    client, holders = _http_clients[key]
    if holders > 1:
        _http_clients[key] = (client, holders - 1)
        return
    del _http_clients[key]
    await client.close()


def register() -> None:
    """Make ``harness.id=bridges_seat`` resolve to this module in verifiers' loader."""
    sys.modules.setdefault(f"verifiers.v1.harnesses.{SEAT_ID}", sys.modules[__name__])


class SeatCallFailed(Exception):
    """The interception endpoint refused a call or answered something that is not a chat reply."""


async def _chat(url: str, auth: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
    """One chat call as JSON over the loop's shared HTTP client: the reply's message, without nulls.

    Why not the OpenAI SDK, as the null program uses: its request path (parameter transforms, request
    and response models) cost a third of a rollout's CPU here, and this loop reads three fields.
    """
    headers = {**auth, "Content-Type": "application/json"}
    async with _http_client().post(url, data=to_json(body), headers=headers) as response:
        status, raw = response.status, await response.read()
    try:
        payload = from_json(raw)
    except ValueError:
        payload = None
    text = raw[:300].decode(errors="replace")
    if status != 200 or not isinstance(payload, dict):
        error = payload.get("error") if isinstance(payload, dict) else None
        said = error.get("message") if isinstance(error, dict) else text
        raise SeatCallFailed(f"the model call was answered {status}: {said}")
    try:
        message = payload["choices"][0]["message"]
        return {k: v for k, v in message.items() if v is not None}
    except (KeyError, IndexError, TypeError, AttributeError):
        raise SeatCallFailed(f"the model call's reply has no choices[0].message: {text}") from None


class InProcessChatConfig(vf.HarnessConfig):
    pass


class InProcessChatHarness(vf.Harness[InProcessChatConfig]):
    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_MCP = True
    SUPPORTS_RESUME = True  # verifiers' default resume: relaunch on the accreted conversation
    NEEDS_CONTAINER = False
    EXECUTES_CODE = False

    async def launch(self, ctx: Any, trace: Any, runtime: Any, endpoint: str, secret: str,
                     mcp_urls: dict[str, str], data: Any) -> Any:
        """The null program's loop: chat, run the tools the reply calls, until a reply calls none."""
        system, prompt = self.resolve_prompt(data)
        messages: list[Any] = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        elif prompt is not None:
            messages.extend(message_to_wire(m) for m in prompt)
        tools = await open_toolbox(mcp_urls)
        offered: dict[str, Any] = {"tools": tools.schemas} if tools.schemas else {}
        url, auth = f"{endpoint.rstrip('/')}/chat/completions", {"Authorization": f"Bearer {secret}"}
        for _ in range(MAX_CALLS):
            body = {"model": ctx.model, "messages": messages, **offered}
            message = await _chat(url, auth, body)
            messages.append(message)
            calls = message.get("tool_calls") or []
            if not calls:
                break
            for call in calls:
                function = call.get("function") or {}
                content = (
                    await tools.call(str(function.get("name", "")), function.get("arguments"))
                    if call.get("type") == "function"
                    else f"error: the {call.get('type')} tool type is not run here"
                )
                messages.append({"role": "tool", "tool_call_id": call.get("id"), "content": content})
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")


__all__ = ["InProcessChatHarness"]
