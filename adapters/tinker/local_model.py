"""The model behind the local Tinker server: one base checkpoint, a peft LoRA adapter per training client.

Everything here is synchronous and runs on the server's single worker thread, in the order the
requests arrived, which is the ordering Tinker promises per training client. Weights a sampler
uses are snapshots (copies of the adapter tensors taken at ``save_weights_for_sampler``), so
training on after a sampler was created never changes what that sampler samples; sampling swaps
the snapshot in for the duration of one batch.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import math
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bridges.adapters.tinker.losses import datum_loss
from bridges.models.token_logprobs import chunked_matches_plain, token_logprobs

ATTN_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
FORWARD_BATCH = 64  # datums per forward pass in forward_backward


@dataclass
class TrainDatum:
    tokens: list[int]  # model_input
    inputs: dict[
        str, torch.Tensor
    ]  # loss_fn_inputs, aligned with tokens (target_tokens[t] follows tokens[t])


@dataclass
class SampledSequence:
    tokens: list[int]
    logprobs: list[float]
    stop_reason: str  # "stop" | "length"


@dataclass
class LoraPolicy:
    """One training client's adapter and optimizer state (names as peft gives them)."""

    model: Any
    rank: int
    optimizer: torch.optim.Optimizer | None = None
    steps: int = 0

    def trainable(self) -> dict[str, torch.nn.Parameter]:
        return {n: p for n, p in self.model.named_parameters() if p.requires_grad}

    def snapshot(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().clone() for n, p in self.trainable().items()}

    def load(self, weights: Mapping[str, torch.Tensor]) -> None:
        params = self.trainable()
        with torch.no_grad():
            for name, tensor in weights.items():
                params[name].copy_(tensor)


class LocalModel:
    """The base model, its tokenizer, and the LoRA policies trained on it."""

    def __init__(self, path: str | Path, *, device: str = "auto") -> None:
        from transformers import AutoTokenizer

        from bridges.models.hardware import load_causal_lm, placement

        self.path = str(path)
        where = placement(device)
        self.device = where.device
        self.base: Any = load_causal_lm(self.path, where).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(self.path)
        config = self.base.config
        self.max_context = int(getattr(config, "max_position_embeddings", 4096))
        self.vocab_size = int(self.base.get_input_embeddings().num_embeddings)
        self.chunked_logprobs = chunked_matches_plain(self.base, self.vocab_size)
        eos = self.tokenizer.eos_token_id
        self.eos_ids = {eos} if eos is not None else set()

    # -- training clients -------------------------------------------------------------------------
    def new_policy(
        self, rank: int, *, train_attn: bool, train_mlp: bool, train_unembed: bool, seed: int | None
    ) -> LoraPolicy:
        from peft import LoraConfig, get_peft_model

        present = {name.rsplit(".", 1)[-1] for name, _ in self.base.named_modules()}
        targets = [
            m
            for m in (*(ATTN_MODULES if train_attn else ()), *(MLP_MODULES if train_mlp else ()))
            if m in present
        ]
        if train_unembed and "lm_head" in present:
            targets.append("lm_head")
        if not targets:
            raise ValueError("the LoRA config trains nothing: enable train_attn, train_mlp or train_unembed.")
        if seed is not None:
            torch.manual_seed(seed)
        with warnings.catch_warnings():
            # Tinker's train_unembed adapts the output projection alone; on a tied model peft warns that
            # the embedding does not share that adapter, which is the meaning here (nothing is merged)
            warnings.filterwarnings("ignore", message="Model has `tie_word_embeddings=True`")
            model = get_peft_model(
                copy.deepcopy(self.base), LoraConfig(r=rank, lora_alpha=rank, target_modules=targets)
            )
        return LoraPolicy(model=model.train(), rank=rank)

    def forward_backward(
        self,
        policy: LoraPolicy,
        data: Sequence[TrainDatum],
        loss_fn: str,
        config: Mapping[str, float] | None,
        forward_only: bool,
    ) -> tuple[list[list[float]], float]:
        """Per-datum target logprobs and the summed loss; gradients accumulate until ``optim_step``.

        Datums run in right-padded batches of ``FORWARD_BATCH``; each datum's loss only reads its own
        positions, so the sum equals the per-datum computation.
        """
        outputs: list[list[float]] = []
        total = 0.0
        for start in range(0, len(data), FORWARD_BATCH):
            chunk = data[start : start + FORWARD_BATCH]
            with torch.set_grad_enabled(not forward_only):
                logp_B_T = self._batch_logprobs(policy.model, chunk)
                loss = sum(
                    datum_loss(
                        loss_fn,
                        logp_B_T[i, : len(d.tokens)],
                        {k: v.to(self.device) for k, v in d.inputs.items()},
                        config,
                    )
                    for i, d in enumerate(chunk)
                )
                if not forward_only:
                    loss.backward()  # type: ignore[union-attr]
            outputs.extend(
                logp_B_T[i, : len(d.tokens)].detach().float().cpu().tolist() for i, d in enumerate(chunk)
            )
            total += float(loss.detach())  # type: ignore[union-attr]
        return outputs, total

    def _batch_logprobs(self, model: Any, data: Sequence[TrainDatum]) -> torch.Tensor:
        """Each datum's target logprobs (right-padded rows), through the trainer's own chunked
        computation (``bridges.models.token_logprobs``): never all B×T×V logits at once."""
        width = max(len(d.tokens) for d in data)
        ids_B_T = torch.zeros((len(data), width), dtype=torch.long, device=self.device)
        targets_B_T = torch.zeros((len(data), width), dtype=torch.long, device=self.device)
        mask_B_T = torch.zeros((len(data), width), dtype=torch.long, device=self.device)
        for i, d in enumerate(data):
            n = len(d.tokens)
            ids_B_T[i, :n] = torch.tensor(d.tokens, device=self.device)
            targets_B_T[i, :n] = d.inputs["target_tokens"].long().to(self.device)
            mask_B_T[i, :n] = 1
        return token_logprobs(model, ids_B_T, mask_B_T, targets_B_T, mask_B_T, chunked=self.chunked_logprobs)

    def optim_step(self, policy: LoraPolicy, adam: Mapping[str, float]) -> dict[str, float]:
        """One AdamW step with this call's hyperparameters (Tinker sends them every step)."""
        params = list(policy.trainable().values())
        lr = float(adam.get("learning_rate", 1e-4))
        betas = (float(adam.get("beta1", 0.9)), float(adam.get("beta2", 0.95)))
        eps, decay = float(adam.get("eps", 1e-12)), float(adam.get("weight_decay", 0.0))
        if policy.optimizer is None:
            policy.optimizer = torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=decay)
        for group in policy.optimizer.param_groups:
            group.update(lr=lr, betas=betas, eps=eps, weight_decay=decay)
        clip = float(adam.get("grad_clip_norm", 0.0))
        norm = torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else math.inf)
        skipped = not math.isfinite(float(norm))
        if not skipped:  # a non-finite gradient would turn every weight into NaN for good
            policy.optimizer.step()
            policy.steps += 1
        policy.optimizer.zero_grad(set_to_none=True)
        return {
            "optim/lr": lr,
            "optim/grad_norm": float(norm),
            "optim/step": float(policy.steps),
            "optim/skipped": float(skipped),
        }

    # -- sampling ---------------------------------------------------------------------------------
    @torch.no_grad()
    def sample(
        self,
        policy: LoraPolicy | None,
        weights: Mapping[str, torch.Tensor] | None,
        requests: Sequence[tuple[list[int], int, Mapping[str, Any]]],
    ) -> list[list[SampledSequence]]:
        """Continuations for every ``(prompt, num_samples, sampling_params)`` request, all in one batch,
        with the snapshot ``weights`` (None: the base model). Each row keeps its own parameters and seed."""
        from bridges.adapters.hf.decode import generate_batch

        rows = [row for prompt, n, params in requests for row in self._rows(prompt, n, params)]
        pad = self.tokenizer.pad_token_id
        pad = pad if pad is not None else min(self.eos_ids, default=0)
        with self._sampling_model(policy, weights) as model:
            results = iter(generate_batch(model, self.tokenizer, rows, pad_token_id=pad, device=self.device))
        return [
            [
                SampledSequence(r.token_ids, r.logprobs, "stop" if r.finish_reason == "stop" else "length")
                for r in itertools.islice(results, n)
            ]
            for _, n, _ in requests
        ]

    def _rows(self, prompt: list[int], n: int, params: Mapping[str, Any]) -> list[Any]:
        """Tinker's sampling parameters as decode rows (``stop``: strings or ids; ``[]`` turns EOS off)."""
        from bridges.adapters.hf.decode import RowRequest
        from bridges.adapters.hf.sampling import row_seed
        from bridges.envs.types import SamplingParams

        stop = params.get("stop")
        stops = stop if isinstance(stop, list) else [stop] if stop else []
        stop_strings = [s for s in stops if isinstance(s, str)]
        stop_ids = {s for s in stops if isinstance(s, int)}
        if stop is None or stops:
            stop_ids |= self.eos_ids
        room = self.max_context - len(prompt)
        if room < 1:
            raise ValueError(
                f"the prompt has {len(prompt)} tokens; the context window is {self.max_context}."
            )
        max_new = max(1, min(int(params.get("max_tokens") or room), room))
        sampling = SamplingParams(
            max_tokens=max_new,
            temperature=float(params.get("temperature", 1.0)),
            top_p=float(params.get("top_p", 1.0)),
            top_k=int(params.get("top_k", -1)),
            stop=stop_strings,
        )
        seed = params.get("seed")
        return [
            RowRequest(
                list(prompt),
                sampling,
                max_new,
                None if seed is None else row_seed(int(seed), i),
                frozenset(stop_ids),
            )
            for i in range(n)
        ]

    @contextlib.contextmanager
    def _sampling_model(
        self, policy: LoraPolicy | None, weights: Mapping[str, torch.Tensor] | None
    ) -> Iterator[Any]:
        """The model with the sampler's snapshot swapped in (the base model when there is none)."""
        if policy is None or weights is None:
            yield self.base
            return
        saved = policy.snapshot()
        policy.load(weights)
        try:
            yield policy.model.eval()
        finally:
            policy.load(saved)
            policy.model.train()

    @torch.no_grad()
    def prompt_logprobs(
        self, policy: LoraPolicy | None, weights: Mapping[str, torch.Tensor] | None, prompt: list[int]
    ) -> list[float]:
        """NaN for the first token, then log p(token t | tokens < t)."""
        if len(prompt) < 2:
            return [math.nan] * len(prompt)
        with self._sampling_model(policy, weights) as model:
            datum = TrainDatum(prompt[:-1], {"target_tokens": torch.tensor(prompt[1:], device="cpu")})  # as on the wire
            return [math.nan, *self._batch_logprobs(model, [datum])[0].cpu().tolist()]
