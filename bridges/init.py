"""``python -m bridges.init <name>``: scaffold an installable environment package in ``./<name>/``.

What environment libraries taught their users: an environment is a package. The scaffold holds a
``pyproject.toml`` registering ``load_environment`` under the ``rl_bridges.environments`` entry-point
group (so after ``pip install -e ./<name>``, ``env=<name>`` works from any folder), the module with
a small single-turn environment (a generated dataset and a two-function rubric), a README, and a test
that evaluates it on the tiny model. The scaffold passes its own test as generated.

Refused in one sentence (exit 2): a name that is not a lowercase identifier (dashes allowed), one
that an importable module or a bundled environment already has, and a folder that already exists.
"""

from __future__ import annotations

import sys
from pathlib import Path

from bridges.jobs.scaffold import scaffold
from bridges.runs.config import run_cli


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or args[0] in ("-h", "--help", "help"):
        print("usage: python -m bridges.init <name>   (scaffolds an environment package in ./<name>/)")
        return 0 if args and args[0] in ("-h", "--help", "help") else 2
    name = args[0].removeprefix("name=")
    folder = scaffold(name, Path.cwd())
    print(f"created {folder}/ ({', '.join(sorted(p.name for p in folder.iterdir()))})")
    print(
        f"next: pip install -e ./{name} && python -m bridges.eval env={name} model=tiny && python -m pytest {name}"
    )
    return 0


def cli() -> None:
    run_cli(main)


if __name__ == "__main__":
    run_cli(main)
