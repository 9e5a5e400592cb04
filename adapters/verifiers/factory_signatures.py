"""pydantic's question "does this default factory take the validated data?", answered once per class.

Why: verifiers v1 records every turn of a trace with ``model_construct``, and pydantic (2.10 and later)
asks, for each field with a ``default_factory``, whether the factory takes the validated data, by
running ``inspect.signature`` on it on every call. For a builtin class (``list``, ``dict``) that means
parsing its text signature (``inspect._signature_fromstr``, an ``ast.parse``), which also leaves
cyclic garbage for the collector: 13% of a v1 rollout's CPU here, and the remedy took v1 rollouts from
about 505 to 590 a second (``benchmarks/v1_rollouts.py``' in-process path, tiny engine). pydantic
remembers the answer for private attributes (pydantic#13390) but not on this path (pydantic#10536).

The answer depends only on the factory, so for factories that are classes (few, long-lived, hashable)
it is remembered; any other factory (a function, a lambda, a ``partial``) is asked as before. Installed
once per process, by ``V1Environment``; where pydantic has no such function, nothing is changed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

MAX_REMEMBERED = 1024  # distinct factory classes; a process has a few dozen

_answers: dict[type, Any] = {}


def remembering(ask: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``ask`` with its answers for class factories remembered (see the module doc)."""

    def takes_validated_data_argument(default_factory: Any) -> Any:
        if not isinstance(default_factory, type):
            return ask(default_factory)
        try:
            return _answers[default_factory]
        except KeyError:
            answer = ask(default_factory)
            if len(_answers) < MAX_REMEMBERED:
                _answers[default_factory] = answer
            return answer
        except TypeError:  # a class its metaclass made unhashable: asked every time, as before
            return ask(default_factory)

    takes_validated_data_argument.remembering = True  # type: ignore[attr-defined]
    return takes_validated_data_argument


def install() -> bool:
    """Put ``remembering`` in front of pydantic's check; False where this pydantic has none."""
    try:
        from pydantic._internal import _fields
    except ImportError:
        return False
    ask = getattr(_fields, "takes_validated_data_argument", None)
    if not callable(ask):
        return False
    if not getattr(ask, "remembering", False):
        _fields.takes_validated_data_argument = remembering(ask)  # type: ignore[assignment]
    return True
