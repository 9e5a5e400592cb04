"""What holds under every verifiers release the extra admits: 0.3.x (legacy API and v1, openai 3.x) and
0.4.x (v1 only, openai 2.x). CI runs this file in the main environment and again in one with
verifiers 0.4 (``.ci/verifiers-0.4``); under 0.4 nothing here is simulated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bridges.envs.registry import load_environment
from bridges.runtime.errors import ConfigError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture(autouse=True)
def _fixtures_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(FIXTURES))


def _as_under_a_v1_only_release(monkeypatch: pytest.MonkeyPatch) -> Any:
    """verifiers as 0.4 ships it: the version, and no legacy classes at the package root."""
    import verifiers

    from bridges.adapters.verifiers import FIRST_V1_ONLY, version_tuple

    if version_tuple(verifiers.__version__) >= FIRST_V1_ONLY:
        return verifiers  # the real thing

    def gone(name: str) -> Any:
        raise AttributeError(f"module 'verifiers' has no attribute {name!r}", name=name, obj=verifiers)

    monkeypatch.setattr(verifiers, "__version__", "0.4.0")
    monkeypatch.setattr(verifiers, "__getattr__", gone, raising=False)
    for legacy in ("SingleTurnEnv", "MultiTurnEnv", "Rubric"):
        monkeypatch.delitem(verifiers.__dict__, legacy, raising=False)
    return verifiers


@pytest.mark.parametrize("env_id", ["vf:vf_fixture_envs", "vf_legacy_under_v1_only"])
def test_a_legacy_environment_under_a_v1_only_verifiers_names_the_release_it_needs(
    monkeypatch: pytest.MonkeyPatch, env_id: str
):
    verifiers = _as_under_a_v1_only_release(monkeypatch)
    with pytest.raises(ConfigError) as info:
        load_environment(env_id)
    message = str(info.value)
    assert f"verifiers {verifiers.__version__} is installed, which ships only the v1 API" in message
    assert "pip install 'verifiers>=0.1.8,<0.4'" in message and "\n" not in message


def test_the_installed_pair_is_one_the_extra_admits():
    """verifiers 0.3.x runs beside openai 3.x, 0.4.x beside openai 2.54+: both inside our own range."""
    import openai
    import verifiers

    from bridges.adapters.verifiers import version_tuple

    vf, oa = version_tuple(verifiers.__version__), version_tuple(openai.__version__)
    assert (0, 3) <= vf < (0, 5) and (2, 54) <= oa < (4,)
    assert oa >= (3,) if vf < (0, 4) else oa < (3,)
