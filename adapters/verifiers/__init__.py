"""Environments written for verifiers' legacy API (0.1.8–0.3.x), run unchanged on every rl-bridges backend.

``load_environment("vf:<module>", **kwargs)`` (or any module whose ``load_environment`` returns a
verifiers environment) builds the environment with the real ``verifiers`` package and wraps it in
``VerifiersEnvironment``. Its rollouts run verifiers' own loop (``env_response``, ``@vf.stop``
conditions, parsers, tools) against our ``EngineClient``, wrapped in verifiers' client type where
its version needs one; every chat completion the loop receives is recorded with its token ids, so
the rollout becomes a token-exact episode that trains on grpo, TRL, verl and Tinker alike. Scoring
is verifiers' own rubric (group reward functions included), so rewards are what verifiers computes.
"""

from __future__ import annotations

import importlib
from typing import Any

from bridges.adapters.verifiers.support import (
    FIRST_V1_ONLY,
    LEGACY_RANGE,
    SUPPORTED_RANGE,
    installed_version,
    legacy_refusal,
    require_legacy_api,
    require_verifiers,
    version_tuple,
)
from bridges.runtime.errors import ConfigError


def is_verifiers_environment(obj: Any) -> bool:
    """True for an environment object from the verifiers package (checked without importing it)."""
    return any(cls.__module__.split(".")[0] == "verifiers" for cls in type(obj).__mro__)


def wrap(
    vf_env: Any,
    env_id: str | None = None,
    env_args: dict[str, Any] | None = None,
    reward_timeout: float = 60.0,
) -> Any:
    """A verifiers environment as ours; ``reward_timeout`` bounds each of its reward function calls."""
    from bridges.adapters.verifiers.environment import VerifiersEnvironment

    require_legacy_api()
    return VerifiersEnvironment(vf_env, env_id=env_id, env_args=env_args, reward_timeout=reward_timeout)


def load_v1_environment(module: Any, **env_args: Any) -> Any:
    """The verifiers v1 taskset ``module`` exports, as ours (``v1_load``); ``env_args`` is its ``EnvConfig``."""
    from bridges.adapters.verifiers.v1_load import load_v1_environment as load

    return load(module, **env_args)


def load_vf_environment(module: str, **kwargs: Any) -> Any:
    """``module.load_environment(**kwargs)`` with verifiers checked first, wrapped."""
    require_legacy_api()
    try:
        loaded = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and module.startswith(exc.name):
            raise ConfigError(
                f"no importable module '{module}' for the verifiers environment 'vf:{module}'."
            ) from exc
        raise
    vf_env = loaded.load_environment(**kwargs)
    if not is_verifiers_environment(vf_env):
        raise ConfigError(
            f"'{module}.load_environment' returned {type(vf_env).__name__}, not a verifiers environment."
        )
    return wrap(vf_env, env_id=f"vf:{module}", env_args=dict(kwargs))


__all__ = [
    "FIRST_V1_ONLY",
    "LEGACY_RANGE",
    "installed_version",
    "legacy_refusal",
    "SUPPORTED_RANGE",
    "require_legacy_api",
    "version_tuple",
    "is_verifiers_environment",
    "load_v1_environment",
    "load_vf_environment",
    "require_verifiers",
    "wrap",
]
