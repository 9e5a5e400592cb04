"""``python -m bridges.export rollouts=<results.jsonl|traces.jsonl.gz|folder> output=<folder>``: rollouts -> SFT data;
``python -m bridges.export model=<run folder> output=<folder>``: a run's trained model -> one loadable folder.

The rollouts ``bridges.eval`` writes (and the traces of any training run) become a ``datasets``
dataset for supervised training: chat messages plus the exact token ids and assistant masks of what
was sampled (``bridges.workflows.sft_data``). Keep what is worth imitating with ``min_reward=``,
``metric=``/``min_metric=``, ``top_k=`` per example and ``dedupe=``; ``push_to_hub=<repo>`` also
uploads it (after the local copy is saved). Train on it with ``python -m bridges.sft data=<output>``.

``model=`` takes a run folder of any backend that keeps weights locally (grpo, trl, verl, ``bridges.sft``),
its ``checkpoints/`` folder or one checkpoint, and writes the newest model there as a Hugging Face folder
(a LoRA adapter merged into its base unless ``merge_lora=false``); ``push_to_hub=<repo>`` uploads it with
the token in ``HF_TOKEN`` (``private=true`` for a private repo).
"""

from __future__ import annotations

import sys

from bridges.jobs.export import ExportConfig, export
from bridges.runs.config import parse_config, run_cli


def main(argv: list[str] | None = None) -> int:
    """Parse ``key=value`` arguments (``sys.argv`` when None) and run; returns the exit code."""
    return export(parse_config(ExportConfig, sys.argv[1:] if argv is None else argv))


def cli() -> None:
    """Console-script entry point: errors print as one sentence and exit 2, as with ``python -m``."""
    run_cli(main)


if __name__ == "__main__":
    run_cli(main)
