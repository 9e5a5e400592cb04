"""The batched decode loop: left-padded prompts, one KV cache, each row stopping on its own terms.

Written by hand rather than with ``model.generate`` so that every row keeps its own sampling
parameters, seed and stop conditions, and so that the logprob of each sampled id comes from the
very logits it was drawn from (see ``sampling.py``).

Left padding keeps every row's last prompt token in the same column, so one forward step serves
all rows; ``position_ids`` count only real tokens, so a padded row sees the same positions (and,
up to float noise, the same logits) as it would alone. Finished rows are dropped from the batch
(and from the KV cache) once a quarter of it has finished, so a few long samples do not keep paying
for many short ones.

Everything runs under ``torch.inference_mode``: a model whose weights require grad (the trainer's
policy, a LoRA adapter) would otherwise record a graph at every decode step, and each step's graph
keeps the KV cache it attended over alive, so memory would grow with the square of the length.
Here it grows linearly: weights + the batch's KV cache + one step's logits
(``benchmarks/generation_memory.py``).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import threading
from dataclasses import dataclass, field
from typing import Any

import torch

from bridges.adapters.hf.sampling import BatchSampler, step_counter
from bridges.envs.types import FinishReason, SamplingParams


@dataclass(slots=True)
class RowRequest:
    """One sample to generate: a prompt and the parameters of the request it belongs to."""

    prompt_ids: list[int]
    params: SamplingParams
    max_new_tokens: int  # already clipped to the room left in the context window
    seed: int | None  # the per-row generator seed (see sampling.row_seed), None = global RNG
    stop_token_ids: frozenset[int]  # eos ids + the request's stop_token_ids
    # set when the request's caller gave up (its timeout, a cancelled rollout): the row stops at its
    # next step instead of decoding to max_new_tokens for nobody
    abandoned: threading.Event = field(default_factory=threading.Event)


@dataclass(slots=True)
class RowResult:
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: FinishReason = "length"
    stop_str: str | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None


def _stop_string_hit(tokenizer: Any, ids: list[int], stops: list[str], window: int) -> str | None:
    """The first stop string present in the decoded tail of ``ids``.

    Checked after every token, so a stop string is found on the step that completes it; decoding
    only the last ``window`` ids (longest stop string + a margin) keeps the check O(1) per step.
    Token ids are never cut: every sampled id stays in the sample, as the trainer needs; hiding the
    stop string from the text (``include_stop_str_in_output=False``) is the client's job.
    """
    text = tokenizer.decode(ids[-window:], skip_special_tokens=False)
    for stop in stops:
        if stop and stop in text:
            return stop
    return None


@functools.cache
def cache_keyword() -> str:
    """The name of the KV-cache argument and output field: transformers renamed ``past_key_values`` to
    ``cache`` (the old name still works there but warns on every forward), so the installed version's
    own output class says which one to use."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    names = {f.name for f in dataclasses.fields(CausalLMOutputWithPast)}
    return "cache" if "cache" in names else "past_key_values"


def accepts_logits_to_keep(model: Any) -> bool:
    """Whether the prefill can skip the vocab projection of all but the last position."""
    return "logits_to_keep" in inspect.signature(model.forward).parameters


def _prefill(
    model: Any, rows: list[RowRequest], pad_token_id: int, device: torch.device, logits_to_keep: bool
) -> tuple[torch.Tensor, Any, torch.Tensor, torch.Tensor]:
    """One forward pass over the left-padded prompts: last logits, cache, attention mask, next positions
    (under ``generate_batch``'s inference mode)."""
    lengths = [len(r.prompt_ids) for r in rows]
    width = max(lengths)
    ids_rows = [[pad_token_id] * (width - n) + r.prompt_ids for n, r in zip(lengths, rows, strict=True)]
    mask_rows = [[0] * (width - n) + [1] * n for n in lengths]
    input_ids = torch.tensor(ids_rows, dtype=torch.long, device=device)
    attention_mask = torch.tensor(mask_rows, dtype=torch.long, device=device)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp_(min=0)
    next_position = torch.tensor(lengths, dtype=torch.long, device=device).unsqueeze(1)
    prefill_kwargs = {"logits_to_keep": 1} if logits_to_keep else {}
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=True,
                **prefill_kwargs)
    return out.logits[:, -1, :].float(), out[cache_keyword()], attention_mask, next_position


def finished(tokenizer: Any, row: RowRequest, result: RowResult, token: int, window: int) -> bool:
    """Whether the row ends with ``token`` just appended (setting its finish reason and stop string)."""
    if token in row.stop_token_ids:
        result.finish_reason = "stop"
    elif window and (hit := _stop_string_hit(tokenizer, result.token_ids, row.params.stop, window)):
        result.finish_reason, result.stop_str = "stop", hit
    elif len(result.token_ids) >= row.max_new_tokens:
        result.finish_reason = "length"
    else:
        return False
    return True


@torch.inference_mode()
def generate_batch(
    model: Any,
    tokenizer: Any,
    rows: list[RowRequest],
    *,
    pad_token_id: int,
    device: torch.device,
    logits_to_keep: bool = False,
) -> list[RowResult]:
    """Generate every row to completion and return one result per row, in order. Finished rows are
    dropped from the batch (and the cache) once a quarter of it is done, so long tails run narrow."""
    logits, cache, attention_mask, next_position = _prefill(model, rows, pad_token_id, device, logits_to_keep)
    vocab_size = model.get_output_embeddings().weight.shape[0]
    sampler = BatchSampler([r.params for r in rows], [r.seed for r in rows], vocab_size, device)
    results = [RowResult() for _ in rows]
    top_k = [r.params.top_logprobs for r in rows]
    for result, k in zip(results, top_k, strict=True):
        if k:
            result.top_logprobs = []
    max_top = max(top_k)
    stop_windows = [(max(map(len, r.params.stop)) + 8) if r.params.stop else 0 for r in rows]
    can_compact = hasattr(cache, "batch_select_indices")
    active = list(range(len(rows)))  # batch position -> row index
    alive = [True] * len(rows)  # per batch position: still generating
    n_alive = len(rows)
    step = 0
    while True:
        tokens, logprobs, logp = sampler.sample(logits, step_counter(step))
        step += 1
        token_list, logprob_list = tokens.tolist(), logprobs.tolist()
        top_ids, top_values = sampler.top(logp, max_top) if max_top else ([], [])
        for pos, row_index in enumerate(active):
            if alive[pos]:
                result, token = results[row_index], token_list[pos]
                result.token_ids.append(token)
                result.logprobs.append(logprob_list[pos])
                if result.top_logprobs is not None:
                    k = top_k[row_index]
                    result.top_logprobs.append(list(zip(top_ids[pos][:k], top_values[pos][:k], strict=True)))
                if finished(tokenizer, rows[row_index], result, token, stop_windows[row_index]):
                    alive[pos], n_alive = False, n_alive - 1
                elif rows[row_index].abandoned.is_set():
                    result.finish_reason, alive[pos], n_alive = "abort", False, n_alive - 1
        if n_alive == 0:
            return results
        if can_compact and len(active) - n_alive >= max(1, len(active) // 4):
            keep_list = [pos for pos, a in enumerate(alive) if a]
            keep = torch.tensor(keep_list, dtype=torch.long, device=device)
            cache.batch_select_indices(keep)
            sampler.keep(keep, keep_list)
            tokens, attention_mask, next_position = tokens[keep], attention_mask[keep], next_position[keep]
            active, alive = [active[pos] for pos in keep_list], [True] * n_alive
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones((len(active), 1))], dim=1)
        out = model(input_ids=tokens.unsqueeze(1), attention_mask=attention_mask, position_ids=next_position,
                    use_cache=True, **{cache_keyword(): cache})
        cache, logits = out[cache_keyword()], out.logits[:, -1, :].float()
        next_position = next_position + 1
