"""What a run's reward is made of: each rubric function's own curve, read from the metric rows.

Every backend writes ``reward/<function>/mean`` (and ``/std``) beside the weighted total
``reward/mean``. A total can rise while the function the user cares about stays at zero (a newcomer's
exact-answer reward flat for 400 steps while partial credit rose): the progress line shows each
function, and the end of a run names each one's first → last and says in one line when the total
rose without one of them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_FUNCTION_MEAN = re.compile(r"^reward/(.+)/mean$")
WINDOW = 5  # steps averaged at each end of the run, as the total's first -> last line
MOVED = 0.01  # a function whose first -> last change is smaller did not move


def function_means(row: Mapping[str, Any]) -> dict[str, float]:
    """``{function: mean}`` of one step's row (functions without a finite score that step left out)."""
    found = {}
    for key, value in row.items():
        match = _FUNCTION_MEAN.match(key)
        if match and isinstance(value, int | float) and not isinstance(value, bool):
            found[match.group(1)] = float(value)
    return found


def progress_text(row: Mapping[str, Any]) -> str:
    """`` (correct 0.125, a_number 0.875)`` for the progress line; empty with one function or none."""
    means = function_means(row)
    if len(means) < 2:
        return ""
    return " (" + ", ".join(f"{name} {value:.3f}" for name, value in means.items()) + ")"


def _ends(values: list[float]) -> tuple[float, float]:
    head, tail = values[:WINDOW], values[-WINDOW:]
    return sum(head) / len(head), sum(tail) / len(tail)


def summary_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One line per function (first → last), and one more when the total rose while a function did not."""
    per_step = [function_means(r) for r in rows if "reward/mean" in r]
    names = list(dict.fromkeys(name for means in per_step for name in means))
    if len(names) < 2:
        return []
    ends = {name: _ends([m[name] for m in per_step if name in m]) for name in names}
    lines = [f"  {name}: {first:.3f} -> {last:.3f}" for name, (first, last) in ends.items()]
    totals = [r["reward/mean"] for r in rows if r.get("reward/mean") is not None]
    flat = [name for name, (first, last) in ends.items() if abs(last - first) < MOVED]
    if totals and flat and _ends(totals)[1] - _ends(totals)[0] >= MOVED:
        moved = [name for name in names if name not in flat]
        lines.append(f"the reward rose only through {', '.join(moved) or 'none of its functions'}: "
                     f"{', '.join(flat)} did not move.")
    return lines
