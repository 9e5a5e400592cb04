"""``python -m bridges.rescore traces=<file> env=<id>``: score saved episodes again with the current rubric.

Rewards are a function of the rollout, not of the run: after fixing or changing a reward function,
re-scoring the traces a run already paid for answers "what would the reward have been" without
generating anything. Episodes are re-grouped by (step, example) so group reward functions see the
same groups they saw in training. Rollouts that failed before scoring stay failed; rollouts that
failed only in scoring are scored again.
"""

from __future__ import annotations

import sys

from bridges.jobs.rescore import RescoreConfig, rescore_traces
from bridges.runs.config import parse_config, run_cli


def main(argv: list[str] | None = None) -> int:
    """Parse ``key=value`` arguments (``sys.argv`` when None) and run; returns the exit code."""
    return rescore_traces(parse_config(RescoreConfig, sys.argv[1:] if argv is None else argv))


def cli() -> None:
    """Console-script entry point: errors print as one sentence and exit 2, as with ``python -m``."""
    run_cli(main)


if __name__ == "__main__":
    run_cli(main)
