"""pydantic's default-factory signature check, remembered per factory class: the same answers, and
``model_construct`` builds the same models, with each class's signature worked out once."""

from __future__ import annotations

import functools
from typing import Any

import pytest
from pydantic import BaseModel, Field
from pydantic._internal import _fields

from bridges.adapters.verifiers import factory_signatures


class TakesData:
    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data


class TakesNothing:
    pass


def doubled(data: dict[str, Any]) -> int:
    return int(data["x"]) * 2


def test_answers_are_pydantics_and_each_class_is_asked_once():
    factory_signatures._answers.clear()
    asked: list[Any] = []

    def ask(factory: Any) -> Any:
        asked.append(factory)
        return _fields.takes_validated_data_argument(factory)

    remembered = factory_signatures.remembering(ask)
    factories = [list, dict, set, TakesData, TakesNothing, doubled, lambda: 1, functools.partial(dict, a=1)]
    classes = [f for f in factories if isinstance(f, type)]
    for _ in range(3):
        assert [remembered(f) for f in factories] == [_fields.takes_validated_data_argument(f) for f in factories]
    assert [remembered(c) for c in classes] == [False, False, False, True, False]
    others = [f for f in factories if not isinstance(f, type)]
    assert asked == classes + others * 3  # each class once; a function, lambda or partial every time


def test_installed_model_construct_builds_the_same_models():
    class Node(BaseModel):
        x: int
        children: list[int] = Field(default_factory=list)
        seen: dict[str, int] = Field(default_factory=dict)
        twice: int = Field(default_factory=doubled)

    before = [Node.model_construct(x=3), Node.model_construct(x=3)]
    assert factory_signatures.install() is True
    assert factory_signatures.install() is True  # once: the wrapper is not wrapped again
    assert getattr(_fields.takes_validated_data_argument, "remembering", False)
    after = [Node.model_construct(x=3), Node.model_construct(x=3)]
    assert before == after and after[0].twice == 6 and after[0].children == []
    after[0].children.append(1)
    assert after[1].children == []  # a fresh list per model, as before
    assert {list, dict} <= set(factory_signatures._answers)


def test_a_pydantic_without_the_check_is_left_as_it_is(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delattr(_fields, "takes_validated_data_argument")
    assert factory_signatures.install() is False
    assert not hasattr(_fields, "takes_validated_data_argument")


def test_a_class_that_cannot_be_hashed_is_asked_every_time():
    class Unhashable(type):
        __hash__ = None  # type: ignore[assignment]

    class Factory(metaclass=Unhashable):
        pass

    asked: list[Any] = []
    remembered = factory_signatures.remembering(lambda f: asked.append(f) or False)
    assert [remembered(Factory), remembered(Factory)] == [False, False]
    assert asked == [Factory, Factory]
