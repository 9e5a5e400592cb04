"""Scaffold an installable environment package (``python -m bridges.init <name>``): the templates and
the name checks, refused in one sentence before a file is written.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from bridges.runtime.errors import ConfigError

_NAME = re.compile(r"[a-z][a-z0-9_-]{0,63}")

PYPROJECT = """\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
version = "0.1.0"
description = "An rl-bridges environment: {name}."
requires-python = ">=3.11"
dependencies = ["rl-bridges"]

# how rl-bridges finds it by name: env={name} in bridges.eval / bridges.train
[project.entry-points."rl_bridges.environments"]
{name} = "{module}:load_environment"

[tool.setuptools]
py-modules = ["{module}"]
"""

MODULE = '''\
"""{name}: say the word you are asked for (a single-turn starter environment).

Replace the rows and the reward functions with your task; keep ``load_environment(**kwargs)``.
"""

from __future__ import annotations

import random

from datasets import Dataset

import bridges as br

WORDS = ["apple", "river", "stone", "cloud", "green", "lamp", "bread", "chair", "ocean", "tiger"]


def make_rows(count: int, seed: int) -> list[dict[str, str]]:
    rng = random.Random(seed)
    words = [rng.choice(WORDS) for _ in range(count)]
    return [{{"question": f"Say the word '{{w}}' and nothing else.", "answer": w}} for w in words]


def exact(completion, answer) -> float:
    """1.0 when the reply is the word itself."""
    return float(completion[-1]["content"].strip().lower() == answer)


def mentions(completion, answer) -> float:
    """Partial credit: the word appears somewhere in the reply."""
    return float(answer in completion[-1]["content"].lower())


def load_environment(num_train: int = 200, num_eval: int = 20, seed: int = 0) -> br.Environment:
    return br.SingleTurnEnv(
        dataset=Dataset.from_list(make_rows(num_train, seed)),
        eval_dataset=Dataset.from_list(make_rows(num_eval, seed + 1)),
        system_prompt="Answer with the requested word only.",
        rubric=br.Rubric(funcs=[exact, mentions], weights=[1.0, 0.2]),
        sampling_args={{"max_tokens": 16, "stop": ["\\n"]}},  # its own sampling: one short line
    )
'''

TEST = '''\
"""{name} evaluates end to end on the tiny model, and its rubric scores a perfect reply 1.2."""

from __future__ import annotations

import json

from bridges.eval import main

import {module}


def test_rubric_scores_a_perfect_reply():
    reply = [{{"role": "assistant", "content": " Apple "}}]
    assert {module}.exact(reply, "apple") == 1.0 and {module}.mentions(reply, "apple") == 1.0
    assert {module}.exact([{{"role": "assistant", "content": "pear"}}], "apple") == 0.0


def test_evaluates_on_the_tiny_model(tmp_path):
    args = ["env={module}", "model=tiny", "num_examples=4", "rollouts_per_example=2", "progress=false",
            f"output={{tmp_path}}"]
    assert main(args) == 0
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 8
    assert all(row["stop_reason"] == "completed" and 0.0 <= row["reward"] <= 1.2 for row in rows)
'''

README = """\
# {name}

An [rl-bridges](https://github.com/) environment. Install it, and it loads by name from anywhere:

```bash
pip install -e ./{name}
python -m bridges.eval env={name} model=tiny num_examples=8
python -m bridges.train env={name}
python -m pytest {name}
```

Edit `{module}.py`: `load_environment(**kwargs)` returns the environment (a dataset, a system
prompt and a rubric); keyword arguments come from `env_args` on the command line.
"""


def check_name(name: str, parent: Path) -> str:
    """The module name for ``name``, or one sentence saying why ``name`` cannot be used."""
    from bridges.envs.registry import list_bundled_environments

    if not _NAME.fullmatch(name):
        raise ConfigError(
            f"'{name}' is not a valid environment name: use lowercase letters, digits, '_' or '-', "
            "starting with a letter (at most 64 characters)."
        )
    module = name.replace("-", "_")
    if (parent / name).exists():  # first: a folder here is also importable from here, as a namespace package
        raise ConfigError(f"{parent / name} already exists; choose another name or remove it.")
    if module in list_bundled_environments() or importlib.util.find_spec(module) is not None:
        raise ConfigError(
            f"'{name}' is already taken by an importable module or a bundled environment; choose another name."
        )
    return module


def scaffold(name: str, parent: Path) -> Path:
    """Write the package folder ``parent/name`` and return it."""
    module = check_name(name, parent)
    folder = parent / name
    folder.mkdir(parents=True)
    files = {
        "pyproject.toml": PYPROJECT,
        f"{module}.py": MODULE,
        f"test_{module}.py": TEST,
        "README.md": README,
    }
    for filename, template in files.items():
        (folder / filename).write_text(template.format(name=name, module=module))
    return folder


