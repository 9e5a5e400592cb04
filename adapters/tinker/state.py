"""The local Tinker server's model side: sessions, training clients, samplers and saves.

Kept apart from the HTTP face (``server.py``) so each reads as one concept: every tinker:// path a
client names resolves to a folder inside ``root`` or is refused, saves are safetensors folders with a
manifest (nothing a client can name is unpickled), and all model work runs in arrival order on one
worker thread (Tinker's per-client ordering).
"""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import re
import shutil
import threading
import uuid
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bridges.adapters.tinker.local_model import LocalModel, LoraPolicy
from bridges.adapters.tinker.requests import MAX_LORA_RANK, plain_name
from bridges.runs.config import option
from bridges.runtime.state_files import (
    flatten_optimizer,
    load_tensors,
    save_tensors,
    unflatten_optimizer,
    verify_manifest,
    write_manifest,
)

SAVE_KINDS = ("weights", "sampler_weights")
# the SDK derives a training client's id as "<session_id>:train:<model_seq_id>" and so must we
_MODEL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}(:train:[0-9]{1,9})?")


@dataclass
class TinkerServerConfig:
    model: str = option("tiny", help="'tiny', a local checkpoint folder or a hub id")
    model_name: str | None = option(None, help="the base_model name clients ask for (default: model)")
    host: str = option("127.0.0.1", help="bind address; a non-loopback one requires api_key")
    port: int = option(8000, ge=0, le=65535, help="port (0: a free one)")
    device: str = option("auto", help="torch device: auto (CUDA when visible, else CPU) | cpu | cuda | cuda:N")
    root: str = option("runs/tinker-server", help="where saves are written; no path a client names leaves it")
    api_key: str | None = option(None, help="required as X-API-Key (the SDK's TINKER_API_KEY) when set")
    log_level: str = option("warning", help="uvicorn's log level")


class TinkerState:
    """Sessions, training clients, samplers and saved weights; the model work runs on one thread."""

    def __init__(self, model: LocalModel, model_name: str, root: str | Path) -> None:
        self.model = model
        self.model_name = model_name
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.policies: dict[str, LoraPolicy] = {}
        self.sessions: set[str] = set()
        self.samplers: dict[str, tuple[str | None, dict[str, torch.Tensor] | None]] = {}
        self.futures: dict[str, concurrent.futures.Future[Any]] = {}
        self.worker = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="tinker-model")
        self._ids = itertools.count(1)
        self._pending_samples: list[tuple[dict[str, Any], concurrent.futures.Future[Any]]] = []
        self._pending_lock = threading.Lock()

    def new_id(self, kind: str) -> str:
        return f"{kind}-{next(self._ids)}-{uuid.uuid4().hex[:8]}"

    def submit(self, work: Any, *args: Any) -> str:
        request_id = self.new_id("req")
        self.futures[request_id] = self.worker.submit(work, *args)
        return request_id

    # -- paths: tinker://<model_id>/<kind>/<name> <-> <root>/<model_id>/<kind>/<name>/ (a save folder)
    def folder_for(self, path: str) -> Path:
        """The save folder of a tinker:// path; every part is a plain name and the result stays in root."""
        if not isinstance(path, str) or not path.startswith("tinker://"):
            raise ValueError(f"'{path!s:.120}' is not a tinker://<model_id>/<kind>/<name> path.")
        parts = path.removeprefix("tinker://").split("/")
        if len(parts) != 3 or parts[1] not in SAVE_KINDS:
            raise ValueError(
                f"'{path:.120}' is not a tinker://<model_id>/<kind>/<name> path with kind "
                f"{' or '.join(SAVE_KINDS)}."
            )
        model_id, kind, name = parts
        if not _MODEL_ID.fullmatch(model_id):
            raise ValueError(f"'{path:.120}' does not name a training client this server could have made.")
        return self._confined(model_id, kind, plain_name(name, "the save name"))

    def _confined(self, *parts: str) -> Path:
        root = self.root.resolve()
        folder = root.joinpath(*parts).resolve()
        if not folder.is_relative_to(root) or folder == root:
            raise ValueError("that path leaves this server's storage folder; it is refused.")
        return folder

    def model_id_for(self, body: dict[str, Any]) -> str:
        """The id the SDK expects (``<session_id>:train:<model_seq_id>``), built only from a session id
        this server issued and an integer, since the id becomes a folder name."""
        session_id, seq = body.get("session_id"), body.get("model_seq_id")
        if session_id is None:
            return self.new_id("model")
        if session_id not in self.sessions:
            raise ValueError(f"unknown session '{session_id!s:.80}'; create a session on this server first.")
        if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq < 10**9:
            raise ValueError(f"model_seq_id must be a non-negative integer, got {seq!r:.40}.")
        return f"{session_id}:train:{seq}"

    def known_model_id(self, model_id: Any) -> str:
        if not isinstance(model_id, str) or model_id not in self.policies:
            raise ValueError(f"no training client '{model_id!s:.80}' on this server.")
        return model_id

    def policy(self, model_id: Any) -> LoraPolicy:
        return self.policies[self.known_model_id(model_id)]

    def check_base(self, base_model: str | None) -> None:
        if base_model and base_model != self.model_name:
            raise ValueError(f"this server serves '{self.model_name}', not '{base_model!s:.80}'.")

    # -- work (runs on the model thread) ----------------------------------------------------------
    def create_model(self, body: dict[str, Any]) -> dict[str, Any]:
        self.check_base(body.get("base_model"))
        lora = body.get("lora_config") or {}
        rank = lora.get("rank", 32)
        if not isinstance(rank, int) or isinstance(rank, bool) or not 1 <= rank <= MAX_LORA_RANK:
            raise ValueError(
                f"lora_config.rank must be an integer from 1 to {MAX_LORA_RANK}, got {rank!r:.40}."
            )
        policy = self.model.new_policy(
            rank,
            train_attn=bool(lora.get("train_attn", True)),
            train_mlp=bool(lora.get("train_mlp", True)),
            train_unembed=bool(lora.get("train_unembed", True)),
            seed=lora.get("seed"),
        )
        model_id = self.model_id_for(body)
        self.policies[model_id] = policy
        return {"type": "create_model", "model_id": model_id}

    def save(self, model_id: str, path: str, with_optimizer: bool) -> dict[str, Any]:
        """Weights (safetensors), optimizer tensors (safetensors) and the rest (JSON), staged then renamed."""
        policy = self.policy(model_id)
        folder = self.folder_for(path)
        staging = folder.with_name(f".tmp-{folder.name}")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        save_tensors(staging / "weights.safetensors", policy.snapshot())
        meta: dict[str, Any] = {"rank": policy.rank, "steps": policy.steps}
        if with_optimizer and policy.optimizer is not None:
            tensors, meta["optimizer"] = flatten_optimizer(policy.optimizer.state_dict())
            save_tensors(staging / "optimizer.safetensors", tensors)
        (staging / "meta.json").write_text(json.dumps(meta))
        write_manifest(staging)
        shutil.rmtree(folder, ignore_errors=True)
        staging.rename(folder)
        return {"path": path}

    def read_save(self, path: str) -> tuple[dict[str, Any], dict[str, torch.Tensor], Path]:
        """(meta, weights, folder) of a save, after checking its manifest; never unpickles anything."""
        folder = self.folder_for(path)
        if not folder.is_dir():
            raise ValueError(f"no saved weights at '{path}'.")
        problem = verify_manifest(folder)
        if problem is not None:
            raise ValueError(f"the save at '{path}' is damaged: {problem}.")
        return (
            json.loads((folder / "meta.json").read_text()),
            load_tensors(folder / "weights.safetensors"),
            folder,
        )

    def load(self, body: dict[str, Any]) -> dict[str, Any]:
        meta, weights, folder = self.read_save(body.get("path"))  # type: ignore[arg-type]
        model_id = body.get("model_id")
        if model_id is None or model_id not in self.policies:  # load into a new training client
            created = self.create_model({**body, "lora_config": {"rank": int(meta["rank"])}})
            model_id = created["model_id"]
        policy = self.policy(model_id)
        policy.load(weights)
        policy.steps = int(meta.get("steps", 0))
        if body.get("optimizer") and "optimizer" in meta:
            policy.optimizer = torch.optim.AdamW(list(policy.trainable().values()))
            tensors = load_tensors(folder / "optimizer.safetensors")
            policy.optimizer.load_state_dict(unflatten_optimizer(tensors, meta["optimizer"]))
        return {"type": "load_weights", "path": body["path"], "model_id": model_id}

    def sampler_weights(self, body: dict[str, Any]) -> dict[str, Any]:
        model_id = body["model_id"]
        policy = self.policy(model_id)
        if body.get("sampling_session_seq_id") is not None or not body.get("path"):
            sampler_id = self.new_id("sampler")
            self.samplers[sampler_id] = (model_id, policy.snapshot())
            return {"type": "save_weights_for_sampler", "sampling_session_id": sampler_id}
        path = f"tinker://{model_id}/sampler_weights/{plain_name(body['path'], 'path')}"
        self.save(model_id, path, with_optimizer=False)
        return {"type": "save_weights_for_sampler", "path": path}

    def open_sampler(self, body: dict[str, Any]) -> str:
        """A sampling session over a saved path or the base model."""
        path = body.get("model_path")
        sampler_id = self.new_id("sampler")
        if path:
            meta, weights, folder = self.read_save(path)
            model_id = folder.parent.parent.name
            if model_id not in self.policies:  # weights from an earlier server run: give them a policy
                self.policies[model_id] = self.model.new_policy(
                    int(meta["rank"]), train_attn=True, train_mlp=True, train_unembed=True, seed=None
                )
            self.samplers[sampler_id] = (model_id, weights)
        else:
            self.check_base(body.get("base_model"))
            self.samplers[sampler_id] = (None, None)
        return sampler_id

    def submit_sample(self, body: dict[str, Any]) -> str:
        """Queue a sample request; requests waiting together run as one decode batch per sampler."""
        request_id = self.new_id("req")
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.futures[request_id] = future
        with self._pending_lock:
            self._pending_samples.append((body, future))
        self.worker.submit(self._drain_samples)
        return request_id

    def _drain_samples(self) -> None:
        from bridges.adapters.tinker.wire import sample_response

        with self._pending_lock:
            batch, self._pending_samples = self._pending_samples, []
        by_sampler: dict[str, list[tuple[dict[str, Any], concurrent.futures.Future[Any]]]] = defaultdict(list)
        for body, future in batch:
            try:
                sampler_id = body.get("sampling_session_id") or self.open_sampler(body)
                if sampler_id not in self.samplers:
                    raise ValueError(f"no sampling session '{sampler_id}' on this server.")
                if not any(chunk.get("tokens") for chunk in body["prompt"]["chunks"]):
                    raise ValueError("the prompt has no tokens.")
                by_sampler[sampler_id].append((body, future))
            except Exception as exc:
                future.set_exception(exc)
        for sampler_id, items in by_sampler.items():
            model_id, weights = self.samplers[sampler_id]
            policy = self.policies.get(model_id) if model_id else None
            prompts = [
                [t for chunk in body["prompt"]["chunks"] for t in chunk.get("tokens", [])]
                for body, _ in items
            ]
            try:
                requests = [
                    (p, int(body.get("num_samples", 1)), body["sampling_params"])
                    for p, (body, _) in zip(prompts, items, strict=True)
                ]
                results = self.model.sample(policy, weights, requests)
                for prompt, (body, future), sequences in zip(prompts, items, results, strict=True):
                    logprobs = (
                        self.model.prompt_logprobs(policy, weights, prompt)
                        if body.get("prompt_logprobs")
                        else None
                    )
                    future.set_result(sample_response(sequences, logprobs))
            except Exception as exc:  # every request of the batch learns of it
                for _, future in items:
                    if not future.done():
                        future.set_exception(exc)

    def forward_backward(self, raw: bytes) -> bytes:
        from bridges.adapters.tinker.wire import forward_backward_output, parse_forward_backward

        fields, data = parse_forward_backward(raw, self.model.vocab_size)
        policy = self.policy(fields["model_id"])
        logprobs, loss = self.model.forward_backward(
            policy, data, fields["loss_fn"], fields["loss_fn_config"], fields["forward_only"]
        )
        return forward_backward_output(logprobs, loss)


def build_state(config: TinkerServerConfig) -> TinkerState:
    from bridges.models.tiny import resolve_model_path

    return TinkerState(
        LocalModel(resolve_model_path(config.model), device=config.device),
        config.model_name or config.model,
        config.root,
    )
