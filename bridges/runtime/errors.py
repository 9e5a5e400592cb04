"""Errors with one clear sentence each (docs/design.md §3).

Every error a user can trigger by input (config, environment id, missing extra, bad request) is a
``BridgesError``: the CLIs print its message alone, without a traceback, and exit with code 2.
"""

from __future__ import annotations

import importlib
from types import ModuleType


class BridgesError(Exception):
    """Base class: the message is the whole story, written for the user."""


class ConfigError(BridgesError, ValueError):
    """A configuration key or value the user gave is wrong."""


class MissingExtraError(BridgesError, ImportError):
    """An optional backend library is not installed."""


class EnvironmentNotFoundError(BridgesError, LookupError):
    """``load_environment`` found nothing under the given id."""


class PromptTooLongError(BridgesError, ValueError):
    """The rendered prompt does not fit the engine's context window."""


class EngineError(BridgesError, RuntimeError):
    """The engine failed to produce a sample (after any retries)."""


class UnsupportedRequestError(BridgesError, ValueError):
    """The engine cannot honour a request parameter (for example ``top_logprobs`` on a sampler that
    returns only the sampled id's logprob); the client answers 400 with this sentence."""


class EngineTimeoutError(EngineError, TimeoutError):
    """An engine call did not finish within its timeout."""


class TrainingDivergedError(BridgesError, RuntimeError):
    """Training produced non-finite losses or gradients several steps in a row and was stopped."""


class NothingTrainedError(BridgesError, RuntimeError):
    """A run ended without one step that had anything to learn from (every group's rewards equal)."""


class RewardFunctionError(BridgesError, RuntimeError):
    """A reward function raised (or returned no number) on a row: a bug in the rubric, not a score."""


class JudgeError(BridgesError, RuntimeError):
    """An LLM judge timed out, failed after retries, or answered something unparseable."""


def require_extra(module: str, extra: str, purpose: str | None = None) -> ModuleType:
    """Import an optional dependency or fail with the one sentence that says how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        what = f" for {purpose}" if purpose else ""
        raise MissingExtraError(
            f"'{module}' is needed{what} but is not installed; install it with "
            f"pip install 'rl-bridges[{extra}]'."
        ) from exc
