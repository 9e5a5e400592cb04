"""``python -m bridges.sft data=<dataset folder> [model=tiny] [key=value ...]``: supervised warm-up.

For a model that cannot earn a non-zero reward on its own, RL has nothing to reinforce. A short
supervised warm-up on good rollouts (``bridges.eval`` of a stronger policy, filtered by
``bridges.export``) gives it the format and a start; ``bridges.train model=runs/<run>/final`` then
takes it from there. Training runs on the dataset's own token ids with loss only where the mask is 1
(the assistant's sampled tokens), through TRL's ``SFTTrainer``.

Same conventions as ``bridges.train``: ``model=``, the shared ``trainer.*`` keys it uses (a
non-default one it does not use is refused), ``output_dir``/``run_name``, ``resume=true``,
``metrics.jsonl``, a progress bar and a curve (``loss_curve.png``); ``sft.*`` passes TRL
``SFTConfig`` fields through. ``runs/<run>/final`` is a plain model folder (LoRA merged) that
``bridges.train``, ``bridges.eval`` and ``bridges.serve`` accept as ``model=``.
"""

from __future__ import annotations

import sys

from bridges.jobs.sft import SFTRunConfig, fine_tune
from bridges.runs.config import parse_config, run_cli


def main(argv: list[str] | None = None) -> int:
    """Parse ``key=value`` arguments (``sys.argv`` when None) and run; returns the exit code."""
    return fine_tune(parse_config(SFTRunConfig, sys.argv[1:] if argv is None else argv))


def cli() -> None:
    """Console-script entry point: errors print as one sentence and exit 2, as with ``python -m``."""
    run_cli(main)


if __name__ == "__main__":
    run_cli(main)
