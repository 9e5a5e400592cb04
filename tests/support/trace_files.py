"""A run's traces as tests read them: ``traces.jsonl.gz`` (gzip members), each line parsed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bridges.workflows.traces import TRACES_FILE, read_traces


def run_traces(run_dir: Path) -> list[dict[str, Any]]:
    """Every trace line of the run in ``run_dir``, in the order written."""
    return list(read_traces(Path(run_dir) / TRACES_FILE))
