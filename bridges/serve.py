"""Serve an engine over OpenAI-compatible HTTP, for agents that run out of process.

``python -m bridges.serve model=tiny engine=hf host=127.0.0.1 port=8000 api_key=null``

Every request goes through one ``EngineClient``, so the token ledger works over HTTP exactly as
in-process: a stock ``openai.AsyncOpenAI`` pointed at ``http://host:port/v1`` gets the same JSON,
extras included (``prompt_token_ids``, ``choices[i].token_ids``, ...), and
``extra_body={"return_drift": true}`` adds ``drift_tokens``/``drifted_turns`` to a chat response.

Safety: the server binds loopback by default and refuses a non-loopback host without an
``api_key``: an engine on an open port is free compute for anyone who finds it.
"""

from __future__ import annotations

import sys

from bridges.runs.config import parse_config, run_cli
from bridges.server.run import ServeConfig, serve


def main(argv: list[str] | None = None) -> int:
    """Parse ``key=value`` arguments (``sys.argv`` when None) and run; returns the exit code."""
    return serve(parse_config(ServeConfig, sys.argv[1:] if argv is None else argv))


def cli() -> None:
    """Console-script entry point: errors print as one sentence and exit 2, as with ``python -m``."""
    run_cli(main)


if __name__ == "__main__":
    run_cli(main)
