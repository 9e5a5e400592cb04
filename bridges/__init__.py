"""rl-bridges: write an RL environment once, train it on verl, TRL, Tinker or the bundled GRPO trainer.

The public names below are imported lazily, so ``import bridges`` stays light (no torch, no
openai SDK, no datasets) and fast; each is loaded on first attribute access.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    # typed records and errors
    "State": "bridges.types",
    "Turn": "bridges.types",
    "StopReason": "bridges.types",
    "SamplingParams": "bridges.types",
    "Sample": "bridges.types",
    "Engine": "bridges.types",
    "Messages": "bridges.types",
    "BridgesError": "bridges.errors",
    "ConfigError": "bridges.errors",
    "MissingExtraError": "bridges.errors",
    "EnvironmentNotFoundError": "bridges.errors",
    # environments
    "Environment": "bridges.envs.base",
    "GenerateResult": "bridges.envs.base",
    "SingleTurnEnv": "bridges.envs.singleturn",
    "MultiTurnEnv": "bridges.envs.multiturn",
    "stop": "bridges.envs.multiturn",
    "ToolEnv": "bridges.envs.tool",
    "tool_schema": "bridges.envs.tool_schema",
    # scoring and parsing
    "Rubric": "bridges.rubric",
    "reward": "bridges.rubric",
    "JudgeRubric": "bridges.judge",
    "Parser": "bridges.parsers",
    "XMLParser": "bridges.parsers",
    "ThinkParser": "bridges.parsers",
    # loading
    "load_environment": "bridges.registry",
    # the client layer
    "EngineClient": "bridges.client.engine_client",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'bridges' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from bridges.client.engine_client import EngineClient
    from bridges.envs.base import Environment, GenerateResult
    from bridges.envs.multiturn import MultiTurnEnv, stop
    from bridges.envs.singleturn import SingleTurnEnv
    from bridges.envs.tool import ToolEnv
    from bridges.envs.tool_schema import tool_schema
    from bridges.errors import BridgesError, ConfigError, EnvironmentNotFoundError, MissingExtraError
    from bridges.judge import JudgeRubric
    from bridges.parsers import Parser, ThinkParser, XMLParser
    from bridges.registry import load_environment
    from bridges.rubric import Rubric, reward
    from bridges.types import Engine, Messages, Sample, SamplingParams, State, StopReason, Turn
