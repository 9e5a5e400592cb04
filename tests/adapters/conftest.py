"""Adapter tests: the shared tool-calling model, and the small TRL test environments on sys.path."""

from __future__ import annotations

import sys
from pathlib import Path

from tool_model import tool_model, tool_model_path

sys.path.insert(0, str(Path(__file__).parent / "envs"))
