"""``python -m bridges.eval env=<id> model=<tiny|path|id>``: evaluate an environment, save every rollout.

Evaluation runs are often long and run against rate-limited or flaky endpoints, so nothing that
finished may be lost: each finished group of rollouts is appended to ``results.jsonl`` and flushed
at once, and running the same command again resumes, skipping examples whose rollouts are all
saved. The same records end up in a ``datasets`` dataset (``<output>/dataset``) for analysis and
offline re-scoring. ``engine=hf`` runs a local model through the token-exact ``EngineClient``;
``engine=openai`` evaluates any OpenAI-compatible endpoint, which returns no token ids, so its
results are labelled evaluation-only.
"""

from __future__ import annotations

import sys

from bridges.jobs.evaluate import EvalConfig, evaluate
from bridges.runs.config import parse_config, run_cli


def main(argv: list[str] | None = None) -> int:
    """Parse ``key=value`` arguments (``sys.argv`` when None) and run; returns the exit code."""
    return evaluate(parse_config(EvalConfig, sys.argv[1:] if argv is None else argv))


def cli() -> None:
    """Console-script entry point: errors print as one sentence and exit 2, as with ``python -m``."""
    run_cli(main)


if __name__ == "__main__":
    run_cli(main)
