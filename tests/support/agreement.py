"""``python -m agreement <folder>`` under two processes: each rank offers its own rank as the value to agree on
(as two nodes resuming from different checkpoints would) and writes what ``check_agreement`` said."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from bridges.grpo.parallel import check_agreement, start, stop, world_from_env
from bridges.runtime.errors import ConfigError


def main() -> None:
    world = world_from_env()
    start(world, torch.device("cpu"))
    check_agreement("the same thing", "same", world)  # agreeing ranks pass
    try:
        check_agreement("the step the run resumes from", (world.rank * 4, world.rank * 16), world)
        said = "agreed"
    except ConfigError as exc:
        said = str(exc)
    (Path(sys.argv[1]) / f"rank{world.rank}.txt").write_text(said)
    stop(finished=True)


if __name__ == "__main__":
    main()
