"""Which verifiers this adapter supports, checked once where verifiers is first needed.

The legacy API (``load_environment`` returning ``vf.SingleTurnEnv``, ``vf.MultiTurnEnv``, ``vf.ToolEnv``…)
exists in 0.1.8-0.3.x; 0.4 removed it and ships only ``verifiers.v1``. The extra admits both lines
(``SUPPORTED_RANGE``) so rl-bridges installs beside either; a legacy environment under 0.4 is one
sentence naming the release that has its API.
"""

from __future__ import annotations

from typing import Any

from bridges.runtime.errors import ConfigError, require_extra

SUPPORTED_RANGE = ">=0.1.8,<0.5"
LEGACY_RANGE = ">=0.1.8,<0.4"
FIRST_V1_ONLY = (0, 4)


def version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def installed_version(vf: Any) -> str:
    return str(getattr(vf, "__version__", "0"))


def require_verifiers() -> Any:
    """The installed ``verifiers``, or one sentence saying which range is needed."""
    vf = require_extra("verifiers", "verifiers", "environments written for verifiers")
    version = installed_version(vf)
    if not (0, 1, 8) <= version_tuple(version) < (0, 5):
        raise ConfigError(
            f"verifiers {version} is installed, but rl-bridges supports verifiers 0.1.8-0.4.x "
            f"(pip install 'verifiers{SUPPORTED_RANGE}')."
        )
    return vf


def legacy_refusal(version: str) -> str:
    """The sentence for a legacy environment under a release without the legacy API."""
    return (
        f"verifiers {version} is installed, which ships only the v1 API (verifiers.v1); environments "
        f"written for the legacy API (load_environment returning vf.SingleTurnEnv, vf.MultiTurnEnv, ...) "
        f"need pip install 'verifiers{LEGACY_RANGE}'."
    )


def require_legacy_api() -> Any:
    """The installed ``verifiers`` when it has the legacy API (0.1.8-0.3.x), or one sentence."""
    vf = require_verifiers()
    version = installed_version(vf)
    if version_tuple(version) >= FIRST_V1_ONLY:
        raise ConfigError(legacy_refusal(version))
    return vf
