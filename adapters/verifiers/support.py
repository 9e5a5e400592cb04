"""Which verifiers this adapter supports (0.1.8-0.3.x), checked once where verifiers is first needed."""

from __future__ import annotations

from typing import Any

from bridges.runtime.errors import ConfigError, require_extra

SUPPORTED_RANGE = ">=0.1.8,<0.4"


def version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def require_verifiers() -> Any:
    """The installed ``verifiers``, or one sentence saying which range is needed."""
    vf = require_extra("verifiers", "verifiers", "environments written for verifiers")
    version = str(getattr(vf, "__version__", "0"))
    if not (0, 1, 8) <= version_tuple(version) < (0, 4):
        raise ConfigError(
            f"verifiers {version} is installed, but environments written for verifiers need 0.1.8-0.3.x "
            f"(pip install 'verifiers{SUPPORTED_RANGE}'); 0.4 dropped that API."
        )
    return vf
