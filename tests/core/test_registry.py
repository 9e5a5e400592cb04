"""``load_environment``: bundled modules, entry points, importable modules, and the failures in between.

The fixture modules live in ``tests/core/registry_fixtures`` (put on ``sys.path`` per test); bundled
modules are simulated by extending the real ``environments`` package's ``__path__`` with a temp folder,
so the lookup runs through the real import system rather than a patched registry.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
import textwrap
from pathlib import Path

import pytest

import bridges.environments as environments
from bridges.envs.registry import ENTRY_POINT_GROUP, list_bundled_environments, load_environment
from bridges.runtime.errors import EnvironmentNotFoundError

FIXTURES = Path(__file__).parent / "registry_fixtures"


@pytest.fixture
def fixture_path(monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(FIXTURES))
    return FIXTURES


@pytest.fixture
def bundled_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A temp folder that counts as part of the bundled ``environments`` package for one test."""
    monkeypatch.setattr(environments, "__path__", [*environments.__path__, str(tmp_path)])
    added: list[str] = []

    def add(name: str, source: str) -> None:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        added.append(f"bridges.environments.{name}")
        importlib.invalidate_caches()

    yield add
    for module in added:
        sys.modules.pop(module, None)


def _fake_entry_points(monkeypatch: pytest.MonkeyPatch, *eps: importlib.metadata.EntryPoint) -> None:
    real = importlib.metadata.entry_points

    def entry_points(**params):
        if params.get("group") == ENTRY_POINT_GROUP:
            return importlib.metadata.EntryPoints(eps)
        return real(**params)

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)


def test_importable_module_builds_env_with_kwargs_and_records_id_and_args(fixture_path):
    import bridges_fixture_env as module

    before = len(module.CALLS)
    env = load_environment("bridges-fixture-env", num_rows=3, max_concurrent=5)
    assert module.CALLS[before:] == [{"num_rows": 3, "max_concurrent": 5}]
    assert env.env_id == "bridges-fixture-env"
    assert env.env_args == {"num_rows": 3, "max_concurrent": 5}
    assert env.max_concurrent == 5
    assert env.get_eval_dataset()["question"] == ["q0", "q1", "q2"]


def test_hub_style_id_maps_to_module_name(fixture_path):
    env = load_environment("someone/bridges-fixture-env@0.2.1")
    assert env.env_id == "someone/bridges-fixture-env@0.2.1"
    assert len(env.get_dataset()) == 2


def test_bundled_module_is_found_listed_and_wins_over_entry_point_and_top_level(
    fixture_path, bundled_dir, monkeypatch
):
    # same name as the top-level fixture module and as an entry point: the bundled one must win
    bundled_dir(
        "bridges_fixture_env",
        """
        def load_environment(**kwargs):
            return {"source": "bundled", **kwargs}
        """,
    )
    _fake_entry_points(
        monkeypatch,
        importlib.metadata.EntryPoint(
            name="bridges-fixture-env", value="bridges_fixture_entry:make_env", group=ENTRY_POINT_GROUP
        ),
    )
    assert "bridges_fixture_env" in list_bundled_environments()
    assert load_environment("bridges-fixture-env", x=1) == {"source": "bundled", "x": 1}


def test_entry_point_is_used_before_a_top_level_module(fixture_path, monkeypatch):
    _fake_entry_points(
        monkeypatch,
        importlib.metadata.EntryPoint(
            name="other-env", value="bridges_fixture_env:load_environment", group="x"
        ),
        importlib.metadata.EntryPoint(
            name="bridges-fixture-env", value="bridges_fixture_entry:make_env", group=ENTRY_POINT_GROUP
        ),
    )
    env = load_environment("bridges-fixture-env", level=2)
    assert type(env).__name__ == "Marker"
    assert env.kwargs == {"level": 2}
    assert env.env_id == "bridges-fixture-env" and env.env_args == {"level": 2}


def test_entry_point_with_module_name_spelling(fixture_path, monkeypatch):
    _fake_entry_points(
        monkeypatch,
        importlib.metadata.EntryPoint(
            name="my_plugin_env", value="bridges_fixture_entry:make_env", group=ENTRY_POINT_GROUP
        ),
    )
    assert type(load_environment("my-plugin-env")).__name__ == "Marker"


def test_import_error_inside_an_existing_module_surfaces_as_itself(fixture_path):
    with pytest.raises(ModuleNotFoundError) as info:
        load_environment("bridges-fixture-broken-dep")
    assert not isinstance(info.value, EnvironmentNotFoundError)
    assert info.value.name == "bridges_fixture_missing_dependency"


def test_import_error_inside_a_bundled_module_surfaces_as_itself(bundled_dir):
    bundled_dir(
        "bridges_fixture_bundled_broken",
        """
        raise ImportError("this environment needs the 'sympy' package; pip install sympy.")
        """,
    )
    with pytest.raises(ImportError, match="needs the 'sympy' package") as info:
        load_environment("bridges-fixture-bundled-broken")
    assert not isinstance(info.value, EnvironmentNotFoundError)


def test_module_without_load_environment_is_one_sentence(fixture_path):
    with pytest.raises(EnvironmentNotFoundError) as info:
        load_environment("bridges_fixture_no_loader")
    message = str(info.value)
    assert "'bridges_fixture_no_loader'" in message and "load_environment" in message
    assert "\n" not in message and message.endswith(".")


def test_not_found_names_every_place_it_looked(monkeypatch):
    _fake_entry_points(monkeypatch)
    with pytest.raises(EnvironmentNotFoundError) as info:
        load_environment("no-such-env-anywhere")
    message = str(info.value)
    bundled = list_bundled_environments()
    assert bundled, "the environments package ships at least one environment"
    assert "'no-such-env-anywhere'" in message
    assert all(name in message for name in bundled)
    assert ENTRY_POINT_GROUP in message and "'no_such_env_anywhere'" in message
    assert "\n" not in message and message.endswith(".")


@pytest.mark.parametrize("bad", ["", "   ", "has space", "9lives"])
def test_ids_that_cannot_name_a_module_are_not_found(bad, monkeypatch):
    _fake_entry_points(monkeypatch)
    with pytest.raises(EnvironmentNotFoundError):
        load_environment(bad)


def test_an_error_raised_by_load_environment_itself_is_not_wrapped(bundled_dir):
    bundled_dir(
        "bridges_fixture_raises",
        """
        def load_environment(num_rows=1):
            raise ValueError(f"num_rows must be positive, got {num_rows}.")
        """,
    )
    with pytest.raises(ValueError, match=r"^num_rows must be positive, got -1\.$"):
        load_environment("bridges-fixture-raises", num_rows=-1)


def test_list_bundled_environments_matches_the_package_folder():
    folder = Path(environments.__file__).parent
    expected = sorted(p.stem for p in folder.glob("*.py") if not p.stem.startswith("_"))
    expected += sorted(p.name for p in folder.iterdir() if (p / "__init__.py").is_file())
    assert list_bundled_environments() == sorted(expected)


def test_env_that_already_names_itself_keeps_its_id(fixture_path, bundled_dir):
    bundled_dir(
        "bridges_fixture_named",
        """
        class Env:
            env_id = "chosen-by-author"
            env_args = {"preset": True}

        def load_environment(**kwargs):
            return Env()
        """,
    )
    env = load_environment("bridges-fixture-named", a=1)
    assert env.env_id == "chosen-by-author"
    assert env.env_args == {"preset": True}
