"""The environment API: what an environment is written with, and what a rollout leaves behind.

Holds the typed records (``types``: State, Turn, SamplingParams, the Engine protocol), chat messages
(``messages``), parsers and rubrics (``parsers``, ``rubric``, ``judge``), the environment classes
(``base``, ``singleturn``, ``multiturn``, ``tool``, ``tool_schema``), episode records (``results``) and
finding an environment by id (``registry``).

May import: ``bridges.runtime``. Must not import the client, models, runs or any backend: an
environment talks to "an OpenAI client" it is handed, and trains unchanged wherever it is handed one.
Names are imported lazily, so ``bridges.envs.types`` can be used without loading datasets.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bridges.runtime.lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "Environment": "bridges.envs.base",
    "GenerateResult": "bridges.envs.base",
    "MultiTurnEnv": "bridges.envs.multiturn",
    "stop": "bridges.envs.multiturn",
    "SingleTurnEnv": "bridges.envs.singleturn",
    "ToolEnv": "bridges.envs.tool",
    "tool_schema": "bridges.envs.tool_schema",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports("bridges.envs", _EXPORTS, globals())



if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from bridges.envs.base import Environment, GenerateResult  # noqa: F401
    from bridges.envs.multiturn import MultiTurnEnv, stop  # noqa: F401
    from bridges.envs.singleturn import SingleTurnEnv  # noqa: F401
    from bridges.envs.tool import ToolEnv  # noqa: F401
    from bridges.envs.tool_schema import tool_schema  # noqa: F401
