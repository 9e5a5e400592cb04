"""Command-line configuration: structured defaults + ``key=value`` overrides + an optional YAML file.

Every CLI (eval, serve, train, compare, rescore) declares its options as a dataclass and calls
``parse_config``. OmegaConf gives us typed merging and interpolation; this module adds what users
need on top: an unknown key or a wrong type is one sentence naming the key and what is allowed,
and ``section.*`` pass-through sections (``env_args``, ``trl``, ``verl``, ...) accept any key.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import math
import sys
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from bridges.runtime.errors import BridgesError, ConfigError
from bridges.runtime.launch import record_for_launcher

T = TypeVar("T")


def option(
    default: Any = dataclasses.MISSING,
    *,
    help: str = "",
    factory: Callable[[], Any] | None = None,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    choices: Sequence[Any] | None = None,
    replaces: dict[str, str] | None = None,
) -> Any:
    """A config field with its one-line description and the values it accepts (checked by
    ``check_values`` right after parsing, so a bad value fails before anything loads). ``replaces``:
    old spellings (key -> the key to write now), refused with that key as the did-you-mean."""
    metadata = {"help": help, "ge": ge, "gt": gt, "le": le, "choices": tuple(choices) if choices else None,
                "replaces": dict(replaces or {})}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def check_values(config: Any, prefix: str = "") -> None:
    """Every float finite, every constrained field inside its range or choices (``option``), recursively."""
    for f in dataclasses.fields(config):
        value, key, meta = getattr(config, f.name), prefix + f.name, f.metadata
        if dataclasses.is_dataclass(value):
            check_values(value, prefix=f"{key}.")
            continue
        if value is None or isinstance(value, dict | list | str | bool) and not meta.get("choices"):
            continue
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{key} must be a finite number, got {value}.")
        if meta.get("choices") and value not in meta["choices"]:
            allowed = ", ".join(str(c) for c in meta["choices"])
            raise ConfigError(f"{key} must be one of {allowed}; got '{value}'.")
        for bound, fails, words in (
            ("ge", lambda v, b: v < b, "at least"),
            ("gt", lambda v, b: v <= b, "greater than"),
            ("le", lambda v, b: v > b, "at most"),
        ):
            limit = meta.get(bound)
            if limit is not None and fails(value, limit):
                raise ConfigError(f"{key} must be {words} {limit}, got {value}.")


HELP_FLAGS = ("--help", "-h", "help")


class HelpRequested(Exception):
    """``--help``/``-h``/``help[=<section>]`` on a command line: the text to print, then exit 0."""


def _type_name(tp: Any) -> str:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in args) + (
            " or null" if type(None) in typing.get_args(tp) else ""
        )
    if typing.get_origin(tp) is list:
        return f"list[{_type_name(args[0])}]" if args else "list"
    return getattr(tp, "__name__", str(tp))


def _rule(meta: Any) -> str:
    parts = [
        f"{op} {meta[key]}"
        for key, op in (("ge", ">="), ("gt", ">"), ("le", "<="))
        if meta.get(key) is not None
    ]
    if meta.get("choices"):
        parts.append("one of " + ", ".join(str(c) for c in meta["choices"]))
    return f" [{'; '.join(parts)}]" if parts else ""


def help_text(schema: type, section: str | None = None) -> str:
    """Every key of ``schema`` with its type, default and description, grouped by section; generated
    from the dataclasses themselves, so it cannot drift from what the parser accepts."""
    sections: dict[str, list[tuple[str, str, str]]] = {"": []}
    open_sections: list[tuple[str, str]] = []

    def walk(cls: type, prefix: str) -> None:
        hints = _field_types(cls)
        for f in dataclasses.fields(cls):
            key, tp, meta = prefix + f.name, hints[f.name], f.metadata
            if isinstance(tp, type) and dataclasses.is_dataclass(tp):
                sections.setdefault(key, [])
                walk(tp, key + ".")
                continue
            if _is_dict_type(tp):
                open_sections.append((f"{key}.*", meta.get("help", "")))
                continue
            factory: Any = f.default_factory
            default = f.default if f.default is not dataclasses.MISSING else factory()
            shown = json.dumps(default) if default is None or isinstance(default, bool | list) else default
            sections.setdefault(prefix.rstrip("."), []).append(
                (key, f"{_type_name(tp)} = {shown}", meta.get("help", "") + _rule(meta))
            )

    walk(schema, "")
    if section is not None and section not in sections:
        names = ", ".join(n for n in sections if n) or "none"
        raise ConfigError(f"help={section}: no such section; sections: {names}.")
    rows = [r for name, group in sections.items() if section in (None, name) for r in group]
    width = max((len(k) for k, _, _ in rows), default=0)
    kind = min(28, max((len(t) for _, t, _ in rows), default=0))
    lines = ["usage: key=value ... [config=<file.yaml>]   (help=<section> for one section)", ""]
    for name, group in sections.items():
        if section not in (None, name) or not group:
            continue
        lines.append(f"{name or 'top-level'} keys:")
        lines.extend(f"  {k.ljust(width)}  {t.ljust(kind)}  {d}".rstrip() for k, t, d in group)
        lines.append("")
    if section is None and open_sections:
        lines.append("open sections (any sub-key, passed through):")
        lines.extend(f"  {k.ljust(width)}  {d}" for k, d in open_sections)
    return "\n".join(lines).rstrip() + "\n"


def _parse_value(raw: str) -> Any:
    """Parse a command-line value the way YAML would (``3`` -> int, ``[a,b]`` -> list, ``true`` -> bool)."""
    import yaml

    try:
        return yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        return raw


def _valid_keys(schema: type) -> list[str]:
    return [f.name for f in dataclasses.fields(schema)]


@functools.cache
def _field_types(schema: type) -> dict[str, Any]:
    """Resolved field annotations (modules use ``from __future__ import annotations``, so they are strings)."""
    return typing.get_type_hints(schema)


def _is_dict_type(tp: Any) -> bool:
    return tp is dict or typing.get_origin(tp) is dict


def _nested_schema(schema: type, key: str) -> type | None:
    tp = _field_types(schema).get(key)
    return tp if isinstance(tp, type) and dataclasses.is_dataclass(tp) else None


def _unknown_key_error(key: str, schema: type, prefix: str = "") -> ConfigError:
    valid = _valid_keys(schema)
    renamed = {old: new for f in dataclasses.fields(schema) for old, new in f.metadata.get("replaces", {}).items()}
    close = difflib.get_close_matches(key.split(".")[0], valid, n=1)
    hint = f" (did you mean '{prefix}{close[0]}'?)" if close else ""
    if key.split(".")[0] in renamed:
        hint = f" (did you mean '{prefix}{renamed[key.split('.')[0]]}'? every command spells it so)"
    return ConfigError(f"unknown config key '{prefix}{key}'{hint}; valid keys: {', '.join(valid)}.")


def parse_config(schema: type[T], argv: Sequence[str]) -> T:
    """Build a ``schema`` instance from ``key=value`` arguments (``config=<yaml>`` is merged first).

    Dict-typed fields (``env_args``, backend pass-through sections) are open: any sub-key is accepted.
    Raises ``ConfigError`` with one sentence for a malformed argument, an unknown key or a wrong type.
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    for arg in argv:
        if arg in HELP_FLAGS or arg.startswith("help="):
            raise HelpRequested(help_text(schema, arg.split("=", 1)[1] if "=" in arg else None))
    pairs: list[tuple[str, str]] = []
    yaml_path: str | None = None
    for arg in argv:
        if "=" not in arg or arg.startswith("="):
            raise ConfigError(f"argument '{arg}' is not of the form key=value (for example num_examples=8).")
        key, value = arg.split("=", 1)
        if key.startswith("-"):  # one syntax, as every page writes it: a dashed key is not taken silently
            bare = key.lstrip("-").replace("-", "_")
            raise ConfigError(f"argument '{arg}' has leading dashes; arguments are key=value: {bare}={value}.")
        if key == "config":
            yaml_path = value
        else:
            pairs.append((key, value))

    base = OmegaConf.structured(schema)
    try:
        if yaml_path is not None:
            loaded = _load_yaml(yaml_path)
            _check_keys(schema, loaded)
            base = OmegaConf.merge(base, loaded)
        for key, raw in pairs:
            _check_keys(schema, _nest(key, None))
            OmegaConf.update(base, key, _parse_value(raw), merge=True, force_add=_is_open(schema, key))
        config = OmegaConf.to_object(base)
    except ConfigError:
        raise
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or "?"
        detail = str(exc).splitlines()[0].rstrip(".")
        raise ConfigError(f"invalid value for config key '{key}': {detail}.") from None
    check_values(config)
    return config  # type: ignore[return-value]


def parse_section(schema: type[T], section: dict[str, Any], prefix: str) -> T:
    """A free-form section (``tinker.*``) as a typed, range-checked ``schema`` instance; an unknown key,
    a wrong type or a value out of range is one sentence naming ``<prefix><key>``."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        _check_keys(schema, section, prefix=prefix)
        parsed = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), section))
    except OmegaConfBaseException as exc:
        detail = str(exc).splitlines()[0].rstrip(".")
        raise ConfigError(f"invalid value for config key '{prefix}{exc.full_key}': {detail}.") from None
    check_values(parsed, prefix=prefix)
    return parsed  # type: ignore[return-value]


_SCALARS: dict[str, tuple[tuple[type, ...], str]] = {
    "bool": ((bool,), "true or false"), "int": ((int,), "an integer"), "float": ((int, float), "a number"),
    "str": ((str, int, float), "a string"),
}


def _accepted(native_type: Any) -> tuple[tuple[type, ...], str, bool] | None:
    """The Python types a scalar field takes, their description and whether it takes None; None when
    the field is not a plain scalar (then its value is left to the native library)."""
    text = native_type.__name__ if isinstance(native_type, type) else str(native_type)
    parts = [p.strip() for p in text.split("|") if p.strip() != "None"]
    if len(parts) != 1 or parts[0] not in _SCALARS:
        return None
    kinds, words = _SCALARS[parts[0]]
    return kinds, words, "None" in text


def check_passthrough(
    section: dict[str, Any], known: dict[str, Any], prefix: str, owner: str, unknown_hint: str = ""
) -> None:
    """A pass-through section checked against the native config it feeds (``trl.*`` -> GRPOConfig):
    ``known`` maps every native key to its type (a class or a ``'int | None'`` string); an unknown key
    or a scalar of the wrong type is one sentence, found before the native library ever sees it."""
    for key, value in section.items():
        if key not in known and any(k.startswith(f"{key}.") for k in known):
            raise ConfigError(
                f"'{prefix}{key}' is a section of {owner}; set its keys ({prefix}{key}.<key>=...)."
            )
        if key not in known:
            close = difflib.get_close_matches(key, list(known), n=1)
            hint = f" (did you mean '{prefix}{close[0]}'?)" if close else ""
            raise ConfigError(f"'{prefix}{key}' is not a key of {owner}{hint}{unknown_hint}.")
        accepted = _accepted(known[key])
        if accepted is None or (value is None and accepted[2]):
            continue
        kinds, words, nullable = accepted
        if value is None or (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
            raise ConfigError(
                f"{prefix}{key} must be {words}{' or null' if nullable else ''} in {owner}, got {value!r}."
            )


def with_open_sections(schema: type[T], names: Sequence[str], help: str) -> type[T]:
    """``schema`` plus one free-form ``<name>.*`` section per name (what installed plugins add)."""
    if not names:
        return schema
    fields = [(name, dict[str, Any], option(factory=dict, help=help)) for name in names]
    return dataclasses.make_dataclass(schema.__name__, fields, bases=(schema,))


def _load_yaml(path: str) -> dict[str, Any]:
    """A YAML config file as a mapping; a missing, unreadable, malformed or non-mapping file is one sentence."""
    import yaml

    try:
        with open(path) as fh:
            loaded = yaml.safe_load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file '{path}' does not exist.") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file '{path}' cannot be read ({exc.__class__.__name__}).") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "malformed YAML"
        raise ConfigError(f"config file '{path}' is not valid YAML{where}: {problem}.") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict) or not all(isinstance(k, str) for k in loaded):
        raise ConfigError(
            f"config file '{path}' must hold a mapping of keys to values (key: value lines), "
            f"not a {type(loaded).__name__}."
        )
    return loaded


def _nest(dotted: str, value: Any) -> dict[str, Any]:
    out: Any = value
    for part in reversed(dotted.split(".")):
        out = {part: out}
    return out


def _is_open(schema: type, dotted: str) -> bool:
    """True when ``dotted`` lands inside a dict-typed (free-form) field such as ``env_args``."""
    current: type | None = schema
    for part in dotted.split("."):
        if current is None:
            return False
        types = _field_types(current)
        if part not in types:
            return False
        if _is_dict_type(types[part]):
            return True
        current = _nested_schema(current, part)
    return False


def _check_keys(schema: type, tree: dict[str, Any], prefix: str = "") -> None:
    fields = {f.name: f for f in dataclasses.fields(schema)}
    for key, value in tree.items():
        if key not in fields:
            raise _unknown_key_error(key, schema, prefix)
        if _is_open(schema, key):
            continue
        nested = _nested_schema(schema, key)
        if isinstance(value, dict):
            if nested is None:
                sub = next(iter(value))
                raise ConfigError(f"config key '{prefix}{key}' is a single value and has no sub-key '{sub}'.")
            _check_keys(nested, value, prefix=f"{prefix}{key}.")


def to_yaml(config: Any) -> str:
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.structured(config))


def working_folder_importable() -> None:
    """Put the working folder first on ``sys.path``, as ``python -m`` does, so a console script
    (``bridges-train env=my_env``) finds ``./my_env.py`` exactly as ``python -m bridges.train`` does;
    not under ``python -P`` / ``PYTHONSAFEPATH``, which asked for the opposite."""
    import os

    if sys.flags.safe_path:
        return
    here = os.getcwd()
    if not any(entry in ("", here) for entry in sys.path):
        sys.path.insert(0, here)


def run_cli(main: Callable[[list[str]], int | None], argv: Sequence[str] | None = None) -> None:
    """Run a CLI entry point: a ``BridgesError`` prints its one sentence (no traceback) and exits 2."""
    args = list(sys.argv[1:] if argv is None else argv)
    working_folder_importable()
    try:
        code = main(args)
    except HelpRequested as shown:
        print(shown, end="")
        raise SystemExit(0) from None
    except BridgesError as exc:
        record_for_launcher(str(exc))
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        print("interrupted; finished results are saved.", file=sys.stderr)
        raise SystemExit(130) from None
    raise SystemExit(code or 0)
