"""``torchrun … rank_fault.py RANK STEP key=value …``: ``bridges.train`` in which process RANK raises
``RuntimeError`` in the backward pass of step STEP, as a CUDA out-of-memory error on one GPU would."""

from __future__ import annotations

import itertools
import sys
from typing import Any

from bridges.grpo import trainer
from bridges.runs.config import run_cli
from bridges.train import main

RANK, STEP = int(sys.argv[1]), int(sys.argv[2])
_train_step, _steps = trainer.train_step, itertools.count(1)


def failing_train_step(ctx: Any, samples: Any) -> Any:
    if next(_steps) == STEP and ctx.world.rank == RANK:
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
    return _train_step(ctx, samples)


trainer.train_step = failing_train_step

if __name__ == "__main__":
    run_cli(main, sys.argv[3:])
