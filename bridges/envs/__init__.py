"""Environment classes: the base (datasets, scoring, many rollouts) and the rollout loops built on it."""

from bridges.envs.base import Environment, GenerateResult
from bridges.envs.multiturn import MultiTurnEnv, stop
from bridges.envs.singleturn import SingleTurnEnv
from bridges.envs.tool import ToolEnv
from bridges.envs.tool_schema import tool_schema

__all__ = ["Environment", "GenerateResult", "MultiTurnEnv", "SingleTurnEnv", "ToolEnv", "stop", "tool_schema"]
