"""``python -m bridges.train [backend=grpo] [key=value ...]``: train an environment on a backend.

With no arguments it is the embedded default: the bundled GRPO trainer, the local transformers
engine, the tiny model and the ``repeat_letter`` toy environment, on CPU in a few minutes.
``dry_run=true`` prints the resolved configuration (and, for launcher backends, the command) and exits.
"""

from __future__ import annotations

import inspect
import sys

from bridges.backends import resolve_backend
from bridges.config import parse_config, run_cli, to_yaml
from bridges.train_config import TrainConfig


def main(argv: list[str] | None = None) -> int:
    config = parse_config(TrainConfig, sys.argv[1:] if argv is None else argv)
    runner = resolve_backend(config.backend)
    if config.dry_run:
        print(to_yaml(config), end="")
        describe = getattr(inspect.getmodule(runner), "describe", None)
        if describe is not None:  # what the backend would hand its native trainer
            print(describe(config), end="")
        return 0
    return int(runner(config) or 0)


def cli() -> None:
    """Console-script entry point: errors print as one sentence and exit 2, as with ``python -m``."""
    run_cli(main)


if __name__ == "__main__":
    run_cli(main)
