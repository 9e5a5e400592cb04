"""Shared fixtures: one tiny model per test session, and a fresh engine per test over its weights.

Building the tiny model takes a second and loading it a little less; tests would pay that hundreds
of times without session scope. The engine itself is cheap, so each test gets its own (clean
counters, its own event-loop state), while the weights are shared.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """Under ``-n``, hand each xdist worker two tests at a time (unless ``--maxschedchunk`` says
    otherwise): xdist's default first hands each worker a quarter of its share in one block, and the
    block holding every slow test (they come first, below) would run them one after another while the
    other worker ran out of work."""
    if getattr(config.option, "maxschedchunk", 0) is None:
        config.option.maxschedchunk = 1


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked ``slow`` run first, in collection order otherwise: under ``-n 2`` a worker that
    picks a several-minute test up last would leave the other idle at the end of the run."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(scope="session", autouse=True)
def bridges_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Point ``BRIDGES_CACHE_DIR`` at a session temp dir, so tests never touch the user's cache.

    An already-set variable is kept: a developer (or CI) can reuse one cache across runs that way.
    Subprocesses started by tests inherit the variable and so find the same tiny model.
    """
    existing = os.environ.get("BRIDGES_CACHE_DIR")
    if existing:
        yield Path(existing)
        return
    path = tmp_path_factory.mktemp("bridges-cache")
    os.environ["BRIDGES_CACHE_DIR"] = str(path)
    try:
        yield path
    finally:
        os.environ.pop("BRIDGES_CACHE_DIR", None)


@pytest.fixture(scope="session", autouse=True)
def no_tinker_session_outlives_the_suite() -> Iterator[None]:
    """Every Tinker SDK client a test or our code opened is closed by the end: an open one keeps its
    heartbeat thread running and prints "Tinker is down" into the terminal after pytest's summary."""
    yield
    from tinker_sessions import open_tinker_sessions

    assert open_tinker_sessions() == 0, "a tinker.ServiceClient was left open (close it: open_service)"


@pytest.fixture(autouse=True)
def own_working_directory(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test starts in a fresh, empty working directory of its own.

    Commands write ``runs/`` and ``outputs/`` relative to where they start, and refuse to start over
    a run that is already there; a suite run from a checkout that has just trained the README's main
    job would otherwise meet that run. Subprocesses a test starts inherit the directory too. A test
    that needs the repository names it by absolute path.
    """
    folder = tmp_path_factory.mktemp("cwd")
    monkeypatch.chdir(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_path(bridges_cache_dir: Path) -> Path:
    """The folder of the tiny model (seed 0), built once per session."""
    from bridges.models.tiny import tiny_model_path

    return tiny_model_path()


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_path: Path) -> Any:
    """The tiny tokenizer, loaded through ``AutoTokenizer`` like any checkpoint's. Do not mutate it."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_path)


@pytest.fixture(scope="session")
def tiny_model(tiny_path: Path) -> Any:
    """The tiny model in eval mode, shared by the whole session: tests must not change its weights
    (load a private copy with ``AutoModelForCausalLM.from_pretrained(tiny_path)`` for that)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_path).eval()


@pytest.fixture
def hf_engine(tiny_model: Any, tiny_tokenizer: Any) -> Iterator[Any]:
    """A fresh ``HFEngine`` (own stats, queues, weight_version 0) over the shared tiny model."""
    from bridges.adapters.hf import HFEngine

    engine = HFEngine(tiny_model, tiny_tokenizer)
    try:
        yield engine
    finally:
        engine.close()


# a scripted engine over the real Qwen2.5 BPE vocabulary (its replies a function of the prompt, tool
# calls included) behind a real ``EngineClient``: for agents in other programs, here and in tests/faults
@pytest.fixture(scope="session")
def qwen_tokenizer(bridges_cache_dir: Path) -> Any:
    from transformers import AutoTokenizer

    from bridges.models.tiny import resolve_model_path

    return AutoTokenizer.from_pretrained(resolve_model_path("tiny-qwen2.5"))


@pytest.fixture
def scripted(qwen_tokenizer: Any) -> Any:
    """``scripted()`` -> (EngineClient, ScriptedEngine); ``scripted(script)`` replies with ``script(prompt)``."""
    from scripted_engine import ScriptedEngine

    from bridges.client import EngineClient

    def make(script: Any = None) -> tuple[Any, Any]:
        engine = ScriptedEngine(qwen_tokenizer) if script is None else ScriptedEngine(qwen_tokenizer, script)
        return EngineClient(engine, model_name="scripted"), engine

    return make
