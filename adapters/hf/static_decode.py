"""The hf engine's decode on fixed shapes, so that on CUDA each step can be one captured graph.

Why: the eager loop (``decode.generate_batch``) is host-bound on a GPU. At Qwen2.5-0.5B's 24 layers a
step issues ~1,650 ATen ops and waits for the device twice (the sampled ids' ``.tolist()``, and
transformers' ``padding_mask.all()`` when it builds the mask): ~25-30 ms of host time against 1-4 ms
of GPU work. Here every tensor a step touches has a shape fixed for the batch, so the step is
captured once as a CUDA graph and replayed (one launch), and nothing in it waits for the device.

How a batch runs:
- **Buckets.** A batch of n rows runs as the smallest power of two >= n (8 at least); the padding rows
  repeat the first row and their output is dropped. When the live rows fit the next smaller bucket,
  they move to the front (K/V, mask, inputs, sampler state) and that bucket's step runs.
- **The arena** (``_Arena``): per layer K/V buffers [rows, kv heads, length, head dim], the 4-D
  attention mask, the step's inputs and outputs and the sampler's per-row tensors, all allocated once
  for a length (the batch's widest prompt + its longest sample + 1, rounded up to a power of two) and
  kept for later batches, since a captured graph names its buffers' addresses. Two lengths are kept.
- **Prefill** is one eager forward writing columns [0, W) through ``StaticKV.update`` (the method the
  model's attention calls on its cache) under a 4-D mask we build: transformers takes a 4-D mask as it
  is (``masking_utils``), so it builds none and never asks the device whether the padding is all ones.
- **Grouped key/value heads** are attended as they are stored (``grouped_attention.py``): transformers'
  sdpa would copy the cache once per query head of a group, every layer, every step.
- **A decode step** opens the mask's next column, runs one token per row (written at that column),
  samples on the device (``sampling.BatchSampler``: a counter-based uniform per row, no generator),
  feeds the ids back and advances the positions, the column and the counter, all in place.
- **The host** copies each step's ids and logprobs to (pinned) host memory without waiting and reads
  step t-1 while step t runs, so stop conditions act one step late and that step's extra id is dropped.
  Only moving to a smaller bucket waits for the device.
- Weights updated in place (``HFEngine.update_weights`` copies into the same tensors) keep every
  captured graph valid.

What falls back to the eager loop: requests with ``top_logprobs``, attention other than ``sdpa``/``eager``
(flash-attention reads no 4-D mask), models with sliding-window layers, models sharded by ``device_map``,
and a model whose forward does not give the eager loop's logprobs on a short probe
(``StaticDecoder.verified``). On the CPU the same path runs without graphs (``tests/adapters/test_static_decode.py``).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from bridges.adapters.hf.decode import RowRequest, RowResult, cache_keyword, finished
from bridges.adapters.hf.grouped_attention import grouped
from bridges.adapters.hf.sampling import COUNTER_STRIDE, BatchSampler, step_counter

logger = logging.getLogger(__name__)

MIN_BUCKET = 8
MIN_LENGTH = 64
ARENAS_KEPT = 2
WARMUP_STEPS = 2  # eager steps (on a side stream) before a bucket's step is captured


def bucket_for(rows: int, largest: int) -> int:
    """The smallest power of two >= ``rows`` (at least ``MIN_BUCKET``), never above ``largest``."""
    size = MIN_BUCKET
    while size < rows:
        size *= 2
    return min(size, max(largest, rows))


def arena_length(columns: int) -> int:
    """The cache length an arena is made for: ``columns`` rounded up to a power of two, so batches of
    similar shape reuse one arena and its graphs."""
    length = MIN_LENGTH
    while length < columns:
        length *= 2
    return length


def supported(model: Any) -> str | None:
    """Why ``model`` cannot decode on fixed shapes here, or None when it can."""
    config = model.config
    attention = getattr(config, "_attn_implementation", None)
    if attention not in ("sdpa", "eager"):
        return f"attention '{attention}' takes no 4-D mask (sdpa and eager do)"
    if any(kind != "full_attention" for kind in (getattr(config, "layer_types", None) or ["full_attention"])):
        return "the model has sliding-window layers"
    if getattr(model, "hf_device_map", None) is not None:
        return "the model is sharded across devices"
    return None


class StaticKV:
    """The cache the model's attention layers call: ``update`` writes this forward's keys and values at
    the arena's current columns and returns the first ``visible`` columns of the layer's buffers."""

    def __init__(self, arena: _Arena, rows: int, visible: int, columns: torch.Tensor) -> None:
        self.arena, self.rows, self.visible, self.columns = arena, rows, visible, columns

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *_: Any, **__: Any) -> tuple[
            torch.Tensor, torch.Tensor]:
        keys, values = self.arena.layer(layer_idx, key, value)
        keys, values = keys[: self.rows], values[: self.rows]
        keys.index_copy_(2, self.columns, key)
        values.index_copy_(2, self.columns, value)
        return keys[:, :, : self.visible], values[:, :, : self.visible]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.visible


@dataclass(eq=False)
class _Arena:
    """Every buffer a bucket's step reads or writes, for one cache length (see the module doc)."""

    length: int
    rows: int
    device: torch.device
    mask_dtype: torch.dtype
    keys: dict[int, torch.Tensor] = field(default_factory=dict)
    values: dict[int, torch.Tensor] = field(default_factory=dict)
    steps: dict[tuple[Any, ...], Callable[[], None]] = field(default_factory=dict)
    pool: Any = None

    def __post_init__(self) -> None:
        rows, device = self.rows, self.device
        self.mask = torch.zeros(rows, 1, 1, self.length, dtype=self.mask_dtype, device=device)
        self.input_ids = torch.zeros(rows, 1, dtype=torch.long, device=device)
        self.positions = torch.zeros(rows, 1, dtype=torch.long, device=device)
        self.columns = torch.zeros(1, dtype=torch.long, device=device)  # where a decode step's K/V land
        self.counter = torch.zeros((), dtype=torch.long, device=device)
        self.tokens = torch.zeros(rows, dtype=torch.long, device=device)
        self.logprobs = torch.zeros(rows, dtype=torch.float32, device=device)
        self.sampler: dict[str, torch.Tensor] = {}

    def layer(self, index: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's buffers, made at its first write (shaped like the model's own keys and values)."""
        if index not in self.keys:
            self.keys[index] = key.new_zeros(self.rows, key.shape[1], self.length, key.shape[3])
            self.values[index] = value.new_zeros(self.rows, value.shape[1], self.length, value.shape[3])
        return self.keys[index], self.values[index]

    def per_row(self) -> list[torch.Tensor]:
        """Every buffer indexed by row first (what moves when rows change buckets)."""
        return [*self.keys.values(), *self.values.values(), self.mask, self.input_ids, self.positions,
                *self.sampler.values()]

    def load_sampler(self, sampler: BatchSampler) -> BatchSampler:
        """Copy the batch's per-row sampler tensors into the arena's (made at the first batch) and return
        a sampler of the batch's kind over them."""
        for name, tensor in sampler.tensors().items():
            own = self.sampler.get(name)
            if own is None:
                own = self.sampler[name] = torch.zeros((self.rows, *tensor.shape[1:]), dtype=tensor.dtype,
                                                       device=self.device)
            own[: tensor.shape[0]].copy_(tensor)
        return sampler.bind(self.sampler)

    def compact(self, keep: list[int]) -> None:
        """Move the rows at positions ``keep`` to the front, in that order."""
        index = torch.tensor(keep, dtype=torch.long, device=self.device)
        for tensor in self.per_row():
            tensor[: len(keep)] = tensor.index_select(0, index)


class StaticDecoder:
    """Fixed-shape decode for one model (``HFEngine`` owns one; every call holds its weight lock)."""

    def __init__(self, model: Any, tokenizer: Any, *, max_rows: int, pad_token_id: int, device: torch.device,
                 cuda_graphs: bool) -> None:
        self.model, self.tokenizer, self.pad_token_id, self.device = model, tokenizer, pad_token_id, device
        self.max_rows = bucket_for(max_rows, 1 << 30)
        self.cuda_graphs = cuda_graphs and device.type == "cuda"
        eager = getattr(model.config, "_attn_implementation", None) == "eager"
        self.mask_dtype = next(model.parameters()).dtype if eager else torch.bool
        self._arenas: OrderedDict[int, _Arena] = OrderedDict()
        pinned = device.type == "cuda"  # two host slots: the step being read and the step in flight
        self.host = [(torch.empty(self.max_rows, dtype=torch.long, device="cpu", pin_memory=pinned),
                      torch.empty(self.max_rows, dtype=torch.float32, device="cpu", pin_memory=pinned))
                     for _ in range(2)]
        self.verified: bool | None = None  # None until the first batch's probe
        self.captured = 0  # graphs captured (tests and the decode probe read it)

    def _open(self) -> Any:
        """The value of a mask entry that lets a query see a key."""
        return True if self.mask_dtype == torch.bool else 0.0

    def _closed(self) -> Any:
        return False if self.mask_dtype == torch.bool else torch.finfo(self.mask_dtype).min

    def arena(self, columns: int) -> _Arena:
        length = arena_length(columns)
        found = self._arenas.pop(length, None)
        if found is None:
            while len(self._arenas) >= ARENAS_KEPT:
                self._arenas.popitem(last=False)  # the least recently used length, with its graphs
            found = _Arena(length, self.max_rows, self.device, self.mask_dtype)
            if self.cuda_graphs:
                found.pool = torch.cuda.graph_pool_handle()
        self._arenas[length] = found
        return found

    @torch.inference_mode()
    def generate(self, rows: list[RowRequest]) -> list[RowResult]:
        """Every row to completion, in order (``HFEngine`` routes only rows this path serves). Grouped
        key/value heads are attended without repeating them (``grouped_attention``)."""
        with grouped(self.model):
            return self._generate(rows)

    def _generate(self, rows: list[RowRequest]) -> list[RowResult]:
        width = max(len(r.prompt_ids) for r in rows)
        arena = self.arena(width + max(r.max_new_tokens for r in rows) + 1)
        size = bucket_for(len(rows), self.max_rows)
        padded = rows + [rows[0]] * (size - len(rows))
        sampler = BatchSampler([r.params for r in padded], [r.seed for r in padded],
                               self.model.get_output_embeddings().weight.shape[0], self.device)
        sampler = arena.load_sampler(sampler)
        self._prefill(arena, padded, width, sampler.bind({k: v[:size] for k, v in arena.sampler.items()}))
        return _Run(self, arena, rows, size, width, sampler).decode()

    def _prefill(self, arena: _Arena, rows: list[RowRequest], width: int, sampler: BatchSampler) -> None:
        """One forward over the left-padded prompts into columns [0, width); the first ids sampled from
        its last position land in the step's inputs, as a decode step's would."""
        size, device = len(rows), self.device
        lengths = torch.tensor([len(r.prompt_ids) for r in rows], device=device)
        ids = torch.tensor([[self.pad_token_id] * (width - len(r.prompt_ids)) + r.prompt_ids for r in rows],
                           dtype=torch.long, device=device)
        real_B_W = torch.arange(width, device=device).unsqueeze(0) >= (width - lengths).unsqueeze(1)
        causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
        # a padding query sees itself: no row of the mask is empty, so no softmax over nothing (NaN)
        allowed = (causal & real_B_W[:, None, :]) | torch.eye(width, dtype=torch.bool, device=device)
        positions = (real_B_W.long().cumsum(-1) - 1).clamp_(min=0)
        kv = StaticKV(arena, size, width, torch.arange(width, device=device))
        out = self.model(input_ids=ids, attention_mask=self._as_mask(allowed[:, None]),
                         position_ids=positions, use_cache=True, logits_to_keep=1, **{cache_keyword(): kv})
        tokens, logprobs, _ = sampler.sample(out.logits[:, -1, :].float(), step_counter(0))
        arena.tokens[:size], arena.logprobs[:size] = tokens, logprobs
        arena.input_ids[:size, 0] = tokens
        arena.positions[:size, 0] = lengths
        arena.mask[:size].fill_(self._closed())
        arena.mask[:size, 0, 0, :width] = self._as_mask(real_B_W)
        arena.columns.fill_(width)
        arena.counter.fill_(step_counter(1))

    def _as_mask(self, allowed: torch.Tensor) -> torch.Tensor:
        if self.mask_dtype == torch.bool:
            return allowed
        return torch.zeros(allowed.shape, dtype=self.mask_dtype, device=allowed.device).masked_fill_(
            ~allowed, self._closed())

    def step(self, arena: _Arena, size: int, sampler: BatchSampler) -> Callable[[], None]:
        """The decode step of ``size`` rows in ``arena``: eager, or on CUDA a graph once warmed up."""
        key = (size, sampler.kind)
        found = arena.steps.get(key)
        if found is None:
            found = arena.steps[key] = self._make_step(arena, size, sampler)
        return found

    def _make_step(self, arena: _Arena, size: int, sampler: BatchSampler) -> Callable[[], None]:
        kv = StaticKV(arena, size, arena.length, arena.columns)
        rows_sampler = sampler.bind({k: v[:size] for k, v in arena.sampler.items()})
        mask, ids, positions = arena.mask[:size], arena.input_ids[:size], arena.positions[:size]
        tokens, logprobs, open_value = arena.tokens[:size], arena.logprobs[:size], self._open()

        def step() -> None:
            mask.index_fill_(3, arena.columns, open_value)
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                             use_cache=True, **{cache_keyword(): kv})
            sampled, sampled_logprobs, _ = rows_sampler.sample(out.logits[:, -1, :].float(), arena.counter)
            tokens.copy_(sampled)
            logprobs.copy_(sampled_logprobs)
            ids.copy_(sampled.unsqueeze(1))
            positions.add_(1)
            arena.columns.add_(1)
            arena.counter.add_(COUNTER_STRIDE)

        return _graphed(step, arena.pool, self) if self.cuda_graphs else step


def _graphed(step: Callable[[], None], pool: Any, decoder: StaticDecoder) -> Callable[[], None]:
    """``step`` run eagerly on a side stream ``WARMUP_STEPS`` times (real steps: cuBLAS and the
    allocator settle), then captured (a capture runs nothing) and replayed from then on."""
    graph: list[Any] = []
    warm = [0]

    def run() -> None:
        if graph:
            graph[0].replay()
            return
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        if warm[0] < WARMUP_STEPS:
            with torch.cuda.stream(stream):
                step()
            torch.cuda.current_stream().wait_stream(stream)
            warm[0] += 1
            return
        captured = torch.cuda.CUDAGraph()
        with torch.cuda.graph(captured, pool=pool):
            step()
        graph.append(captured)
        decoder.captured += 1
        captured.replay()

    return run


class _Run:
    """One batch's decode loop on the host (see the module doc: one step behind, buckets shrinking)."""

    def __init__(self, decoder: StaticDecoder, arena: _Arena, rows: list[RowRequest], size: int, width: int,
                 sampler: BatchSampler) -> None:
        self.decoder, self.arena, self.rows, self.size, self.sampler = decoder, arena, rows, size, sampler
        self.results = [RowResult() for _ in rows]
        self.active = list(range(len(rows)))  # bucket position -> row index (only the live rows)
        self.alive = [True] * len(rows)
        self.windows = [(max(map(len, r.params.stop)) + 8) if r.params.stop else 0 for r in rows]
        self.host, self.slot = decoder.host, 0
        self.in_flight: list[tuple[int, Any, list[int]]] = []  # (host slot, event, bucket positions' rows)

    def _copy_out(self) -> None:
        """Queue this step's ids and logprobs into the next host slot; nothing waits here."""
        tokens, logprobs = self.host[self.slot]
        tokens[: self.size].copy_(self.arena.tokens[: self.size], non_blocking=True)
        logprobs[: self.size].copy_(self.arena.logprobs[: self.size], non_blocking=True)
        event = None
        if self.decoder.device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
        self.in_flight.append((self.slot, event, list(self.active)))
        self.slot = 1 - self.slot

    def decode(self) -> list[RowResult]:
        self._copy_out()  # the prefill's ids
        while True:
            if any(self.alive[i] for i in self.active) and len(self.in_flight) < 2:
                self.decoder.step(self.arena, self.size, self.sampler)()
                self._copy_out()
            if not self.in_flight:
                return self.results
            self._read(*self.in_flight.pop(0))
            live = [pos for pos, i in enumerate(self.active) if self.alive[i]]
            if not live:
                self._drain()
                return self.results
            smaller = bucket_for(len(live), self.decoder.max_rows)
            if smaller < self.size:
                self._drain()
                self._shrink(smaller)

    def _drain(self) -> None:
        while self.in_flight:
            self._read(*self.in_flight.pop(0))

    def _shrink(self, smaller: int) -> None:
        """The live rows to the front of the arena; the smaller bucket's step runs from here."""
        live = [pos for pos, i in enumerate(self.active) if self.alive[i]]
        if not live:
            return
        self.arena.compact(live)
        self.active = [self.active[pos] for pos in live]
        self.size = bucket_for(len(live), self.decoder.max_rows)

    def _read(self, slot: int, event: Any, active: list[int]) -> None:
        """Append one step's ids to the rows still alive, ending those that finish on them."""
        if event is not None:
            event.synchronize()
        tokens, logprobs = self.host[slot]
        token_list, logprob_list = tokens[: len(active)].tolist(), logprobs[: len(active)].tolist()
        tokenizer = self.decoder.tokenizer
        for pos, index in enumerate(active):
            if not self.alive[index]:
                continue
            result, row, token = self.results[index], self.rows[index], token_list[pos]
            result.token_ids.append(token)
            result.logprobs.append(logprob_list[pos])
            if finished(tokenizer, row, result, token, self.windows[index]):
                self.alive[index] = False
            elif row.abandoned.is_set():
                result.finish_reason, self.alive[index] = "abort", False


PROBE_TOKENS = 4


def probe(decoder: StaticDecoder, loop: Callable[[list[RowRequest]], list[RowResult]]) -> str | None:
    """Why this model's fixed-shape decode is not the eager loop's on a short greedy probe, or None.

    A forward that does more with the cache or mask than ``StaticKV`` knows (a model family written
    another way) shows here as other ids or logprobs, and the engine keeps the eager loop. Tolerance:
    1e-3 in fp32, 0.1 in half precision (the two paths add the attention's terms in other orders)."""
    from bridges.envs.types import SamplingParams

    vocab = decoder.model.get_input_embeddings().weight.shape[0]
    params = SamplingParams(max_tokens=PROBE_TOKENS, temperature=0.0)
    prompts = [[i % vocab for i in range(3, 11)], [i % vocab for i in range(5, 8)]]

    def rows() -> list[RowRequest]:
        return [RowRequest(ids, params, PROBE_TOKENS, None, frozenset()) for ids in prompts]

    try:
        got, want = decoder.generate(rows()), loop(rows())
    except Exception as exc:  # an architecture whose attention does not call the cache as StaticKV expects
        return f"its forward fails on a static cache ({type(exc).__name__}: {exc})"
    tolerance = 1e-3 if next(decoder.model.parameters()).dtype == torch.float32 else 0.1
    for a, b in zip(got, want, strict=True):
        if a.token_ids != b.token_ids or max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) > tolerance:
            return "its fixed-shape decode differs from the eager loop on a probe"
    decoder.verified = True
    return None
