"""Finding an environment by id: bundled, registered by entry point, or any importable module.

An import error raised *inside* a module that exists is the real problem (a missing dependency, a
syntax error) and surfaces as itself; only a module that does not exist at all counts as "not found".
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import importlib
import importlib.metadata
import importlib.util
import pkgutil
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from bridges.runtime.errors import ConfigError, EnvironmentNotFoundError, require_extra

ENTRY_POINT_GROUP = "rl_bridges.environments"
BUNDLED_PACKAGE = "bridges.environments"


def _module_name(env_id: str) -> str:
    """``owner/my-env@1.0`` -> ``my_env``: the verifiers convention for hub-style ids."""
    return env_id.split("/")[-1].split("@")[0].replace("-", "_")


def _import_if_exists(name: str) -> ModuleType | None:
    """Import ``name``; None only when that module (or its parent package) does not exist."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (name == missing or name.startswith(missing + ".")):
            return None
        if missing.split(".")[0] == "verifiers":  # an environment written for verifiers, without it
            require_extra("verifiers", "verifiers", f"the environment module '{name}'")
        raise


def _builtin_v1_taskset(name: str) -> ModuleType | None:
    """``verifiers.v1.tasksets.<name>`` when verifiers (0.3+) is installed and ships it."""
    try:
        found = importlib.util.find_spec(f"verifiers.v1.tasksets.{name}")
    except (ImportError, ValueError):
        return None
    return importlib.import_module(found.name) if found is not None else None


def list_bundled_environments() -> list[str]:
    """Module names of the environments shipped in the ``environments`` package."""
    try:
        package = importlib.import_module(BUNDLED_PACKAGE)
    except ModuleNotFoundError:
        return []
    paths = getattr(package, "__path__", [])
    return sorted(m.name for m in pkgutil.iter_modules(paths) if not m.name.startswith("_"))


def _v1_taskset_in(module: ModuleType) -> str | None:
    """The name of a verifiers v1 ``Taskset`` subclass the module exports, found without importing verifiers."""
    for name in getattr(module, "__all__", None) or dir(module):
        obj = getattr(module, name, None)
        if isinstance(obj, type) and any(
            c.__name__ == "Taskset" and c.__module__.startswith("verifiers.v1") for c in obj.__mro__[1:]
        ):
            return name
    return None


def _loader_from(obj: Any, where: str) -> Callable[..., Any]:
    loader = getattr(obj, "load_environment", None) if isinstance(obj, ModuleType) else obj
    if isinstance(obj, ModuleType) and not callable(loader) and _v1_taskset_in(obj) is not None:
        v1_loader: Callable[..., Any] = importlib.import_module(VERIFIERS_ADAPTER).load_v1_environment
        return functools.partial(v1_loader, obj)
    if not callable(loader):
        raise EnvironmentNotFoundError(
            f"{where} was found but does not define a callable load_environment(**kwargs)."
        )
    return loader


def _entry_point(env_id: str, module_name: str) -> Any | None:
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in (env_id, module_name, module_name.replace("_", "-")):
            return ep
    return None


def find_loader(env_id: str) -> Callable[..., Any]:
    """The ``load_environment`` callable for ``env_id`` (bundled, then entry point, then module)."""
    if not env_id or not isinstance(env_id, str):
        raise EnvironmentNotFoundError(f"an environment id must be a non-empty string, got {env_id!r}.")
    module_name = _module_name(env_id)
    if module_name.isidentifier():
        module = _import_if_exists(f"{BUNDLED_PACKAGE}.{module_name}")
        if module is not None:
            return _loader_from(module, f"the bundled environment module '{BUNDLED_PACKAGE}.{module_name}'")
    ep = _entry_point(env_id, module_name)
    if ep is not None:
        return _loader_from(ep.load(), f"the entry point '{ep.name}' ({ep.value})")
    if all(part.isidentifier() for part in module_name.split(".")):
        module = _import_if_exists(module_name)
        if module is not None:
            return _loader_from(module, f"the module '{module_name}'")
    if module_name.isidentifier():  # verifiers' own tasksets (looked up last: it imports verifiers.v1)
        module = _builtin_v1_taskset(module_name.lower())
        if module is not None:
            return _loader_from(module, f"the verifiers v1 taskset '{module.__name__}'")
    names = list_bundled_environments()
    bundled = ", ".join(names) or "none"
    # the working folder's own modules too: a newcomer's typo is most often of the file they just wrote
    local = sorted(p.stem for p in Path.cwd().glob("*.py") if p.stem.isidentifier())
    close = difflib.get_close_matches(module_name, [*local, *names], n=1, cutoff=0.5)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    raise EnvironmentNotFoundError(
        f"no environment '{env_id}'{hint}: it is not bundled (bundled: {bundled}), not registered under the "
        f"'{ENTRY_POINT_GROUP}' entry-point group, and no importable module '{module_name}' exists."
    )


VERIFIERS_PREFIX = "vf:"
VERIFIERS_ADAPTER = "bridges.adapters.verifiers"  # imported only when a verifiers environment is asked for


def load_environment(env_id: str, **kwargs: Any) -> Any:
    """Build the environment ``env_id`` with ``kwargs``; records ``env_id``/``env_args`` on it.

    ``vf:<module>`` loads an environment written for verifiers 0.1.8-0.3.x; a module that turns out
    to return a verifiers environment is wrapped the same way.
    """
    if isinstance(env_id, str) and env_id.startswith(VERIFIERS_PREFIX):
        return importlib.import_module(VERIFIERS_ADAPTER).load_vf_environment(
            env_id.removeprefix(VERIFIERS_PREFIX), **kwargs
        )
    try:
        env = find_loader(env_id)(**kwargs)
    except (AttributeError, ImportError) as exc:
        refusal = _legacy_verifiers_name_missing(exc)
        if refusal:
            raise ConfigError(refusal) from exc
        raise
    if any(cls.__module__.split(".")[0] == "verifiers" for cls in type(env).__mro__):
        env = importlib.import_module(VERIFIERS_ADAPTER).wrap(env, env_id=env_id, env_args=dict(kwargs))
    with contextlib.suppress(AttributeError):  # an object that refuses attributes is still returned
        if getattr(env, "env_id", None) is None:
            env.env_id = env_id
        if not getattr(env, "env_args", None):
            env.env_args = dict(kwargs)
    return env


def _legacy_verifiers_name_missing(exc: AttributeError | ImportError) -> str | None:
    """The sentence for a legacy environment that reached for ``vf.SingleTurnEnv`` & co. under a verifiers
    without them (0.4+), or None for any other failure."""
    if isinstance(exc, AttributeError):
        owner = getattr(exc, "obj", None)
        named = str(exc).startswith("module 'verifiers' has no attribute")
        from_verifiers = named or (isinstance(owner, ModuleType) and owner.__name__ == "verifiers")
    else:
        from_verifiers = exc.name == "verifiers"
    if not from_verifiers:
        return None
    support = importlib.import_module(VERIFIERS_ADAPTER)
    version = support.installed_version(importlib.import_module("verifiers"))
    v1_only = support.version_tuple(version) >= support.FIRST_V1_ONLY
    return support.legacy_refusal(version) if v1_only else None
