"""Where a TRL run resumes from: its newest ``checkpoint-<step>`` folder (both GRPO and SFT runs)."""

from __future__ import annotations

from pathlib import Path


def resume_point(run_dir: Path, resume: bool) -> tuple[str | None, int]:
    """(the checkpoint to resume from, its step); (None, 0) for a fresh start, said in one line when
    ``resume=true`` found nothing to resume."""
    if not resume:
        return None, 0
    checkpoints = sorted(run_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]))
    if not checkpoints:
        print(f"resume=true but {run_dir} has no checkpoint; starting from step 0.")
        return None, 0
    return str(checkpoints[-1]), int(checkpoints[-1].name.split("-")[-1])
