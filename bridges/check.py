"""``python -m bridges.check model=<tiny|tiny-qwen3|folder|hub id>``: is this chat template safe to train on?

Before a run, one screen on the model's tokenizer and chat template (``bridges.client.template_check``):
whether rendering is prefix-preserving over a synthetic conversation with a system prompt, tools,
tool results and reasoning; whether the token ledger extends every turn; which end-of-turn ids the
engine must sample and which the ledger appends; BOS handling; the detected tool-call format and
reasoning markers and whether our parser reads them back; whether history is rewritten (drift by
design). Only the tokenizer is loaded.

Exit status: 0 safe, 1 will drift or cannot parse tool calls, 2 a bad argument (one sentence).
``json=true`` prints the report as JSON; ``report=<file>`` also writes it there.
"""

from __future__ import annotations

import sys

from bridges.jobs.check import CheckConfig, check
from bridges.runs.config import parse_config, run_cli


def main(argv: list[str] | None = None) -> int:
    """Parse ``key=value`` arguments (``sys.argv`` when None) and run; returns the exit code."""
    return check(parse_config(CheckConfig, sys.argv[1:] if argv is None else argv))


def cli() -> None:
    """Console-script entry point: errors print as one sentence and exit 2, as with ``python -m``."""
    run_cli(main)


if __name__ == "__main__":
    run_cli(main)
