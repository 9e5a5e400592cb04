"""rl-bridges: write an RL environment once, train it on verl, TRL, Tinker or the bundled GRPO trainer.

The public names below are imported lazily, so ``import bridges`` stays light (no torch, no
openai SDK, no datasets) and fast; each is loaded on first attribute access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bridges.runtime.lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    # typed records and errors
    "State": "bridges.envs.types",
    "Turn": "bridges.envs.types",
    "StopReason": "bridges.envs.types",
    "SamplingParams": "bridges.envs.types",
    "Sample": "bridges.envs.types",
    "Engine": "bridges.envs.types",
    "Messages": "bridges.envs.types",
    "BridgesError": "bridges.runtime.errors",
    "ConfigError": "bridges.runtime.errors",
    "MissingExtraError": "bridges.runtime.errors",
    "EnvironmentNotFoundError": "bridges.runtime.errors",
    # environments
    "Environment": "bridges.envs.base",
    "GenerateResult": "bridges.envs.base",
    "SingleTurnEnv": "bridges.envs.singleturn",
    "MultiTurnEnv": "bridges.envs.multiturn",
    "stop": "bridges.envs.multiturn",
    "ToolEnv": "bridges.envs.tool",
    "tool_schema": "bridges.envs.tool_schema",
    # scoring and parsing
    "Rubric": "bridges.envs.rubric",
    "reward": "bridges.envs.rubric",
    "JudgeRubric": "bridges.envs.judge",
    "Parser": "bridges.envs.parsers",
    "XMLParser": "bridges.envs.parsers",
    "ThinkParser": "bridges.envs.parsers",
    # loading
    "load_environment": "bridges.envs.registry",
    # the client layer
    "EngineClient": "bridges.client.engine_client",
    # agents in other programs
    "AgentEnv": "bridges.agents.agent_env",
    "AgentOutcome": "bridges.agents.agent_run",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports("bridges", _EXPORTS, globals())




if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from bridges.agents.agent_env import AgentEnv
    from bridges.agents.agent_run import AgentOutcome
    from bridges.client.engine_client import EngineClient
    from bridges.envs.base import Environment, GenerateResult
    from bridges.envs.judge import JudgeRubric
    from bridges.envs.multiturn import MultiTurnEnv, stop
    from bridges.envs.parsers import Parser, ThinkParser, XMLParser
    from bridges.envs.registry import load_environment
    from bridges.envs.rubric import Rubric, reward
    from bridges.envs.singleturn import SingleTurnEnv
    from bridges.envs.tool import ToolEnv
    from bridges.envs.tool_schema import tool_schema
    from bridges.envs.types import Engine, Messages, Sample, SamplingParams, State, StopReason, Turn
    from bridges.runtime.errors import BridgesError, ConfigError, EnvironmentNotFoundError, MissingExtraError
