"""A ``bridges.serve`` over its own copy of the tiny model that takes weight pushes, for the push tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bridges.server.app import WeightUpdates, serve_in_thread


def fresh(tiny_path: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_path).eval()


@contextlib.contextmanager
def weight_server(tiny_path: Path, tokenizer: Any, key: str, identity: bool = False) -> Iterator[tuple[Any, Any]]:
    """(server, engine) taking pushes under ``key``; ``identity``: ``/health`` describes the model, as a
    trainer's server pool checks it."""
    from bridges.adapters.hf import HFEngine
    from bridges.client import EngineClient
    from bridges.models.weight_payload import model_layout, tokenizer_fingerprint

    model = fresh(tiny_path)
    engine = HFEngine(model, tokenizer)
    described = {"layout": model_layout(str(tiny_path)), "tokenizer": tokenizer_fingerprint(tokenizer)}
    client = EngineClient(engine, model_name="tiny")
    with serve_in_thread(client, updates=WeightUpdates(key, model), identity=described if identity else None) as server:
        yield server, engine
    engine.close()
