"""Tool calling: plain Python functions offered to the model as OpenAI tools.

Every tool problem (unknown name, malformed JSON, wrong arguments, a raising or hanging tool) goes
back to the model as a tool message starting with "Error:". The model can recover from it, and for
RL the malformed call is exactly the behaviour the reward should see, so it must not end the
rollout as an environment error.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Sequence
from typing import Any

from bridges.envs.multiturn import MultiTurnEnv, stop
from bridges.envs.tool_schema import tool_schema
from bridges.envs.types import Messages, State, StopReason
from bridges.runtime.asyncutils import describe_exception
from bridges.runtime.errors import ConfigError
from bridges.runtime.usercode import UserCodeTimeout, call_user


def _result_text(result: Any) -> str:
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(result)


class ToolEnv(MultiTurnEnv):
    """Runs the model's tool calls and stops with ``completed`` when a reply calls no tool.

    Metrics: ``tool_calls`` (calls made) and ``tool_errors`` (calls answered with "Error:").
    """

    def __init__(
        self,
        tools: Sequence[Callable[..., Any]] | None = None,
        max_turns: int = 10,
        tool_timeout: float = 30.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(max_turns=max_turns, **kwargs)
        self.tool_timeout = tool_timeout
        self.tools: list[Callable[..., Any]] = []
        self.tool_map: dict[str, Callable[..., Any]] = {}
        self.tool_defs = []
        for tool in tools or []:
            self.add_tool(tool)

    def add_tool(self, tool: Callable[..., Any]) -> None:
        schema = tool_schema(tool)
        name = schema["function"]["name"]
        if name in self.tool_map:
            raise ConfigError(f"two tools are named '{name}'; tool names must be unique.")
        self.tools.append(tool)
        self.tool_map[name] = tool
        self.tool_defs = [*(self.tool_defs or []), schema]

    @stop(priority=50, reason=StopReason.COMPLETED.value)
    def no_tools_called(self, state: State) -> bool:
        if not state.completion:
            return False
        last = state.completion[-1]
        return last["role"] == "assistant" and not last.get("tool_calls")

    def init_state(self, row: dict[str, Any], example_id: int | None = None) -> State:
        state = super().init_state(row, example_id)
        state.metrics["tool_calls"] = 0.0
        state.metrics["tool_errors"] = 0.0
        return state

    async def env_response(self, messages: Messages, state: State) -> Messages:
        replies = []
        for call in messages[-1].get("tool_calls") or []:
            function = call.get("function") or {}
            content = await self.call_tool(function.get("name", ""), function.get("arguments"), state)
            replies.append({"role": "tool", "content": content, "tool_call_id": call.get("id", "")})
        return replies

    async def call_tool(self, name: str, arguments: Any, state: State) -> str:
        """The tool's result as text, or "Error: <one sentence>"; counted in the state's metrics."""
        state.metrics["tool_calls"] = state.metrics.get("tool_calls", 0.0) + 1
        content = await self._run_tool(name, arguments)
        if content.startswith("Error:"):
            state.metrics["tool_errors"] = state.metrics.get("tool_errors", 0.0) + 1
        return content

    async def _run_tool(self, name: str, arguments: Any) -> str:
        tool = self.tool_map.get(name)
        if tool is None:
            available = ", ".join(sorted(self.tool_map)) or "none"
            return f"Error: there is no tool named '{name}'; available tools: {available}."
        if isinstance(arguments, str):
            try:
                args = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError as exc:
                return (
                    f"Error: the arguments for '{name}' are not valid JSON ({exc.msg} at position {exc.pos})."
                )
        else:
            args = arguments or {}
        if not isinstance(args, dict):
            return f"Error: the arguments for '{name}' must be a JSON object, got {type(args).__name__}."
        try:
            inspect.signature(tool).bind(**args)
        except TypeError as exc:
            return f"Error: wrong arguments for '{name}': {exc}."
        try:
            result = await call_user(tool, timeout=self.tool_timeout, what=f"the tool '{name}'", **args)
        except UserCodeTimeout as exc:
            return f"Error: {exc}"
        except Exception as exc:
            return f"Error: the tool '{name}' raised {describe_exception(exc)}"
        return _result_text(result)
