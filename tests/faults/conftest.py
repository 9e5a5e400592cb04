"""Fault-injection suite: shared pieces (the tool model for tool faults, the test environments)."""

from __future__ import annotations

import sys
from pathlib import Path

from tool_model import tool_model, tool_model_path

sys.path.insert(0, str(Path(__file__).parent / "envs"))
