"""``python -m bridges.compare env=<id> backends=[grpo,trl,tinker,verl] model=<...>``: same rows, same
seeds, every backend's engine; are the rewards the same?

Each backend evaluates the environment through the client its training would sample from: the
transformers engine for ``grpo`` and ``trl`` (TRL's generation when ``use_vllm=False``), a Tinker
sampling client for ``tinker`` (the local Tinker server unless ``tinker.base_url`` names another),
and verl's server seam for ``verl`` (answered by the transformers engine where no GPU server runs).
Rows, seeds and sampling are identical, so rollouts pair up one to one; ``report.md``/``report.html``
give reward mean ± 95% CI per backend, a paired bootstrap CI of every pairwise difference with a
verdict (same / differ), stop reasons, token drift and tokens/s, and ``results/`` holds every
rollout as a ``datasets`` dataset. ``runs=[dir,...]`` adds the reward curves of finished training
runs. ``sampling.*`` are ``bridges.eval``'s keys; ``dry_run=true`` checks and prints the resolved config. ``backend_sampling.<backend>.<arg>=...`` changes one backend's sampling (e.g. temperature) on
purpose, to see a difference the report should catch.
"""

from __future__ import annotations

import sys

from bridges.jobs.compare import CompareConfig, compare
from bridges.runs.config import parse_config, run_cli


def main(argv: list[str] | None = None) -> int:
    """Parse ``key=value`` arguments (``sys.argv`` when None) and run; returns the exit code."""
    return compare(parse_config(CompareConfig, sys.argv[1:] if argv is None else argv))


def cli() -> None:
    """Console-script entry point: errors print as one sentence and exit 2, as with ``python -m``."""
    run_cli(main)


if __name__ == "__main__":
    run_cli(main)
