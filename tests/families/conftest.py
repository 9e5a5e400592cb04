"""Tiny random models over real BPE vocabularies (bridges/models/family_models.py), built once per session."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bridges.models.tiny import FAMILY_MODEL_NAMES


@pytest.fixture(scope="session")
def family_paths(bridges_cache_dir: Path) -> dict[str, Path]:
    from bridges.models.family_models import family_model_path

    return {name: family_model_path(name) for name in FAMILY_MODEL_NAMES}


@pytest.fixture(scope="session")
def family_tokenizers(family_paths: dict[str, Path]) -> dict[str, Any]:
    from transformers import AutoTokenizer

    return {name: AutoTokenizer.from_pretrained(path) for name, path in family_paths.items()}
