"""An environment module that exists but needs a dependency that is not installed."""

import bridges_fixture_missing_dependency  # noqa: F401


def load_environment(**kwargs):
    raise AssertionError("never reached: the import above fails")
