"""Where locally built models live: one cache folder, built once per key, atomically.

``model=tiny`` and the ``tiny-<family>`` models are built on this machine (nothing can be
downloaded). Each build goes to a staging folder and is renamed into place, so two processes
starting together (a trainer and its rollout workers) never see half a model; the loser of the race
discards its identical copy.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

TINY_ARCHITECTURE: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
    "head_dim": 16,
}
"""The random Llama-architecture model every built-in model uses (a few MB besides the embedding)."""


def cache_dir() -> Path:
    return Path(os.environ.get("BRIDGES_CACHE_DIR", Path.home() / ".cache" / "rl-bridges"))


def cached_build(name: str, key: object, build: Callable[[Path], object]) -> Path:
    """The folder ``<cache>/<name>-<digest of key>``, made by ``build(staging_folder)`` on first use."""
    digest = hashlib.sha1(repr(key).encode()).hexdigest()[:10]
    target = cache_dir() / f"{name}-{digest}"
    if (target / "config.json").exists() and (target / "tokenizer.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        build(staging)
        with contextlib.suppress(OSError):  # another process won the race; its copy is identical
            staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def save_random_model(
    tokenizer: Any,
    output_dir: str | os.PathLike[str],
    seed: int,
    init: Callable[[Any], None] | None = None,
    **config_overrides: Any,
) -> Path:
    """A seeded random ``TINY_ARCHITECTURE`` model over ``tokenizer``'s vocabulary (``init`` may adjust
    its weights), saved with the tokenizer to ``output_dir`` and loadable by ``from_pretrained``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **{**TINY_ARCHITECTURE, **config_overrides},
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    if init is not None:
        init(model)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    with quiet_save():
        model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@contextlib.contextmanager
def quiet_save() -> Any:
    """No "Writing model shards" bar for a model we build ourselves (once per machine, on first use)."""
    from transformers.utils import logging as transformers_logging

    shown = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            transformers_logging.enable_progress_bar()
