"""The MCP side of the in-process seat: the task's tool servers as chat tools, and their calls.

verifiers starts a task's toolsets (MCP servers over streamable HTTP) for each rollout and hands the
harness their URLs; its ``null`` program lists their tools, offers them to the model as functions
named ``<server>_<tool>`` (bare where the server is nameless) and runs each call on the server. This
is the same contract, in this process, with the ``mcp`` client each release's program uses (1.x for
verifiers 0.3, 2.x for 0.4): a fresh session per operation, as the null program opens one, so a
stateless server needs nothing kept between calls. A bad call — an unknown tool, arguments that are
not a JSON object — is answered to the model as an error message, as the null program answers it; a
server that cannot be reached fails the agent's run, which verifiers records on the trace.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

LIST_TIMEOUT_S = 60.0  # listing every server's tools, as the null program bounds it


@dataclass
class ToolBox:
    """The functions offered to the model, and where each one runs."""

    schemas: list[dict[str, Any]] = field(default_factory=list)
    routes: dict[str, tuple[str, str]] = field(default_factory=dict)  # offered name -> (url, tool)

    async def call(self, name: str, arguments: str | None) -> str | list[dict[str, Any]]:
        """The tool message content for one call the model made."""
        if name not in self.routes:
            return f"error: unknown tool {name!r}"
        try:
            parsed = json.loads(arguments or "{}")
        except json.JSONDecodeError as exc:
            return f"error: invalid JSON in tool arguments ({exc}); resend the call with valid JSON"
        if not isinstance(parsed, dict):
            return f"error: tool arguments must be a JSON object, got {type(parsed).__name__}"
        url, tool = self.routes[name]
        async with _session(url) as session:
            result = await session.call_tool(tool, parsed)
        return _chat_content(result.content)


async def open_toolbox(mcp_urls: dict[str, str]) -> ToolBox:
    """Every server's tools, listed once per agent run (an empty box where the task has none)."""
    import asyncio

    box = ToolBox()
    async with asyncio.timeout(LIST_TIMEOUT_S):
        for server, url in mcp_urls.items():
            async with _session(url) as session:
                listed = (await session.list_tools()).tools
            for listing in listed:
                tool = _wire(listing)
                name = f"{server}_{tool['name']}" if server else tool["name"]
                if name in box.routes:
                    raise ValueError(f"two tool servers offer a tool named {name!r}.")
                box.routes[name] = (url, tool["name"])
                box.schemas.append({
                    "type": "function",
                    "function": {"name": name, "description": tool.get("description") or "",
                                 "parameters": tool["inputSchema"]},
                })
    return box


@asynccontextmanager
async def _session(url: str) -> AsyncIterator[Any]:
    """One MCP session, opened as the null program of the installed verifiers opens it: ``mcp.Client``
    in mcp 2.x (verifiers 0.4; it negotiates the newest protocol, and the server's answers — tool
    schemas included — follow it), a ``ClientSession`` over the stream pair in 1.x (verifiers 0.3)."""
    import mcp
    from mcp.client.streamable_http import streamable_http_client

    async with AsyncExitStack() as stack:
        if hasattr(mcp, "Client"):  # mcp 2.x
            yield await stack.enter_async_context(mcp.Client(streamable_http_client(url)))
            return
        read, write, _ = await stack.enter_async_context(streamable_http_client(url))
        session = await stack.enter_async_context(mcp.ClientSession(read, write))
        await session.initialize()
        yield session


def _wire(model: Any) -> dict[str, Any]:
    """An MCP type as its wire JSON: mcp 2.x renamed the Python fields (``input_schema``, ``mime_type``)
    but kept the protocol's camelCase names as aliases, which 1.x uses as field names."""
    return dict(model.model_dump(by_alias=True, mode="json", exclude_none=True))


def _chat_content(blocks: list[Any]) -> str | list[dict[str, Any]]:
    """MCP content blocks as a tool message's content: text joined, images as image parts."""
    parts: list[dict[str, Any]] = []
    for block in map(_wire, blocks):
        if block["type"] == "text":
            parts.append({"type": "text", "text": block["text"]})
        elif block["type"] == "image":
            url = f"data:{block['mimeType']};base64,{block['data']}"
            parts.append({"type": "image_url", "image_url": {"url": url}})
        else:
            parts.append({"type": "text", "text": json.dumps(block)})
    if all(part["type"] == "text" for part in parts):
        return "\n".join(part["text"] for part in parts)
    return parts
