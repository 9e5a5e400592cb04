"""The one TRL callback that writes our ``metrics.jsonl``: GRPO and SFT runs differ only in which log
lines count and how a line becomes a row, so each passes that as ``row_of``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

RowOf = Callable[[int, dict[str, Any]], "dict[str, Any] | None"]


def metrics_callback(row_of: RowOf, logger: Any, progress: Any = None) -> Any:
    """A ``TrainerCallback`` that turns each of TRL's log dicts into a row (``row_of(step, logs)``; None
    skips the line, e.g. an evaluation log), appends it to ``logger`` (a ``MetricsLogger``; None on
    the ranks that do not write) and shows it on ``progress`` (a ``StepProgress``) as it happens."""
    from transformers import TrainerCallback

    class MetricsFile(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **_: Any):
            row = row_of(state.global_step, logs) if logs else None
            if row is None:
                return
            if logger is not None:
                logger.log(row)
            if progress is not None:
                progress.report(row)

    return MetricsFile()
