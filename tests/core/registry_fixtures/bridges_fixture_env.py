"""An installed-style environment module for the registry tests: exposes load_environment(**kwargs)."""

from __future__ import annotations

from typing import Any

from bridges import Rubric, SingleTurnEnv

CALLS: list[dict[str, Any]] = []


def exact(completion: list[dict[str, Any]], answer: str) -> float:
    return 1.0 if completion and completion[-1]["content"] == answer else 0.0


def load_environment(num_rows: int = 2, **kwargs: Any) -> SingleTurnEnv:
    from datasets import Dataset

    CALLS.append({"num_rows": num_rows, **kwargs})
    rows = {"question": [f"q{i}" for i in range(num_rows)], "answer": [f"a{i}" for i in range(num_rows)]}
    return SingleTurnEnv(dataset=lambda: Dataset.from_dict(rows), rubric=Rubric([exact]), **kwargs)
