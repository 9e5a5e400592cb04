"""Backend registry: ``backend=<name>`` -> the ``Backend`` that runs a training job.

A backend is one declared object, not a module probed for optional names: ``bridges.train`` calls
exactly the members of ``Backend`` and nothing else, so what a new backend must provide is written
down here and checked by the type checker. Names map to dotted paths so no backend library is
imported until that backend is chosen, and third parties add one through the ``rl_bridges.backends``
entry-point group (the entry point names a ``Backend``) without touching any core file.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from bridges.runs.config import parse_section
from bridges.runs.train_config import TrainConfig
from bridges.runtime.errors import ConfigError

BUILTIN_BACKENDS: dict[str, str] = {
    "grpo": "bridges.grpo.trainer:BACKEND",
    "trl": "bridges.adapters.trl.backend:BACKEND",
    "verl": "bridges.adapters.verl.launch:BACKEND",
    "tinker": "bridges.adapters.tinker.backend:BACKEND",
}

ENTRY_POINT_GROUP = "rl_bridges.backends"


def _no_options(section: dict[str, Any]) -> None:
    return None


def _no_checks(config: TrainConfig, options: Any) -> None:
    return None


def _nothing_to_describe(config: TrainConfig, options: Any) -> str:
    return ""


def _no_section_keys() -> str:
    return "this backend has no section of its own: it reads the shared keys (help=trainer, help=sampling).\n"


@dataclasses.dataclass(frozen=True)
class Backend:
    """What a training backend declares.

    ``honoured_keys``: the shared ``trainer.*``/``sampling.*`` keys it reads; a non-default shared
    key outside them is refused, because a run that silently ignores ``trainer.beta=0.1`` is not the
    experiment its command line describes. ``parse_options``: the backend's own ``<name>.*`` section
    as a typed object (one sentence on a bad key or value), handed to the three functions.
    ``validate`` runs every check that needs no model before anything heavy loads (also on
    ``dry_run=true``), ``describe`` is what ``dry_run=true`` prints after the resolved config (what
    the backend would hand its native trainer), ``run`` trains and returns the exit code.
    """

    name: str
    run: Callable[[TrainConfig, Any], int]
    honoured_keys: frozenset[str]
    parse_options: Callable[[dict[str, Any]], Any] = _no_options
    validate: Callable[[TrainConfig, Any], None] = _no_checks
    describe: Callable[[TrainConfig, Any], str] = _nothing_to_describe
    section_help: Callable[[], str] = _no_section_keys


def typed_section_help(schema: type, name: str) -> Callable[[], str]:
    """``section_help`` for a backend whose section is a dataclass: its keys, types, defaults and rules."""

    def text() -> str:
        from bridges.runs.config import help_text

        holder = dataclasses.make_dataclass(f"{name}_section", [(name, schema, dataclasses.field(default_factory=schema))])
        return help_text(holder, name)

    return text


def typed_options(schema: type, name: str) -> Callable[[dict[str, Any]], Any]:
    """``parse_options`` for a backend whose section is a dataclass of ``bridges.runs.config.option`` fields."""

    def parse(section: dict[str, Any]) -> Any:
        return parse_section(schema, section, prefix=f"{name}.")

    return parse


def available_backends() -> dict[str, str]:
    """Built-in backends plus those registered by installed packages (built-ins win on a clash)."""
    found = {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}
    return {**found, **BUILTIN_BACKENDS}


def resolve_backend(name: str) -> Backend:
    backends = available_backends()
    if name not in backends:
        raise ConfigError(f"unknown backend '{name}'; available backends: {', '.join(sorted(backends))}.")
    module_name, _, attr = backends[name].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:  # an entry point of a broken or half-removed package
        raise ConfigError(f"backend '{name}' ({backends[name]}) cannot be imported: {exc}.") from None
    found = getattr(module, attr or "BACKEND", None)
    if not isinstance(found, Backend):
        raise ConfigError(
            f"backend '{name}' ({backends[name]}) does not name a bridges.runs.backends.Backend; a backend "
            "package registers one object that declares run, honoured_keys and its options."
        )
    return found


def installed_sections() -> list[str]:
    """The ``<name>.*`` sections installed backends add to ``bridges.train``'s command line."""
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    return sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name not in fields)


def backend_section(config: Any, name: str) -> dict[str, Any]:
    """The ``<name>.*`` section of a parsed command line: a ``TrainConfig`` field for the built-ins, a
    field ``bridges.train`` added for an installed backend (``installed_sections``), else empty."""
    return dict(getattr(config, name, None) or {})
