"""``python -m bridges.train [backend=grpo] [key=value ...]``: train an environment on a backend.

With no arguments it is the embedded default: the bundled GRPO trainer, the local transformers
engine, the tiny model and the ``repeat_letter`` toy environment, on CPU in a few minutes.
Everything is validated before anything heavy loads (``bridges.runs.preflight`` plus the backend's own
``validate``); ``dry_run=true`` runs the same validation, prints the resolved configuration (and,
for launcher backends, the command) and exits.
"""

from __future__ import annotations

import sys

from bridges.jobs.train import train
from bridges.runs.config import run_cli


def main(argv: list[str] | None = None) -> int:
    """Train from ``key=value`` arguments (``sys.argv`` when None); returns the exit code."""
    return train(sys.argv[1:] if argv is None else argv)


def cli() -> None:
    """Console-script entry point: errors print as one sentence and exit 2, as with ``python -m``."""
    run_cli(main)


if __name__ == "__main__":
    run_cli(main)
