"""Target of a fake `rl_bridges.environments` entry point in the registry tests."""

from __future__ import annotations

from typing import Any


class Marker:
    """Any object may be an environment as far as the registry is concerned; this one records its kwargs."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.env_id: str | None = None
        self.env_args: dict[str, Any] = {}


def make_env(**kwargs: Any) -> Marker:
    return Marker(**kwargs)
