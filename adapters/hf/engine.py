"""``HFEngine``: a transformers causal LM behind the token-level ``Engine`` seam (CPU or one GPU).

Why it is built this way:
- Rollouts call ``generate`` one request at a time, dozens at once. Requests that arrive together
  (in the same event-loop tick, or while a batch is running) become ONE left-padded batch with a KV
  cache: on this 2-core CPU a 64-row batch costs little more per step than one row.
- The batch runs in a worker thread so the event loop (environments, tools, judges, the HTTP
  server) keeps running while the model computes.
- pytest-asyncio and ``asyncio.run`` give each caller its own event loop, and the trainer drives
  the engine from a loop of its own, so queues live per loop (created lazily) while the model,
  its lock and ``weight_version`` are shared: batches from different loops take turns.
- Every batch holds ``weight_lock`` from start to end, and weight updates take the same lock, so
  no batch samples from half-updated weights and each ``Sample.weight_version`` is exactly the
  version its tokens were drawn under.
- Two decode paths, the same samples: the eager loop (``decode.py``: a growing cache, the CPU's
  default) and fixed shapes (``static_decode.py``: row buckets, a static cache, sampling on the device;
  on CUDA each step a replayed CUDA graph, the default there). ``static_cache``/``cuda_graphs`` choose.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from bridges.envs.types import MAX_TOP_LOGPROBS, Sample, SamplingParams
from bridges.models.hardware import bound
from bridges.runtime.errors import BridgesError, EngineError, PromptTooLongError

logger = logging.getLogger(__name__)


class InvalidRequestError(BridgesError, ValueError):
    """A generate call the engine cannot honour (empty prompt, out-of-range parameter)."""


@dataclass(slots=True)
class EngineStats:
    """Counters that show how requests were batched (tests assert on them; logs report them)."""

    requests: int = 0
    batches: int = 0
    rows: int = 0
    prompt_tokens: int = 0
    tokens: int = 0  # generated tokens
    max_batch_rows: int = 0


@dataclass(eq=False)
class _Request:
    rows: list[Any]  # decode.RowRequest, one per sample
    future: asyncio.Future[list[Sample]]
    results: list[Sample | None] = field(default_factory=list)
    taken: int = 0  # rows already handed to a batch
    remaining: int = 0  # rows not yet finished

    def __post_init__(self) -> None:
        self.results = [None] * len(self.rows)
        self.remaining = len(self.rows)


def _abandon_if_cancelled(rows: list[Any], future: asyncio.Future[Any]) -> None:
    """The caller gave up on the request: its rows stop at their next decode step (in a running batch)."""
    if future.cancelled():
        for row in rows:
            row.abandoned.set()


@dataclass(eq=False)
class _LoopQueue:
    loop: asyncio.AbstractEventLoop
    pending: deque[_Request] = field(default_factory=deque)
    worker: asyncio.Task[None] | None = None


class HFEngine:
    """An ``Engine`` over a transformers ``AutoModelForCausalLM`` with request batching."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_batch_size: int = 64,
        device: str | Any = "cpu",  # a torch device (from_pretrained resolves "auto" first)
        max_model_len: int | None = None,
        name: str = "hf",
        static_cache: bool | None = None,
        cuda_graphs: bool | None = None,
    ) -> None:
        import torch

        from bridges.adapters.hf.decode import accepts_logits_to_keep

        if max_batch_size < 1:
            raise InvalidRequestError(f"max_batch_size must be at least 1, got {max_batch_size}.")
        self.device = torch.device(device)
        if getattr(model, "hf_device_map", None) is None:  # a model sharded by device_map stays put
            model.to(self.device)
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.max_batch_size = max_batch_size
        self.max_model_len = int(max_model_len or _context_window(model, tokenizer))
        self.weight_version = 0
        self.stats = EngineStats()
        self.weight_lock = threading.Lock()
        """Held by every batch from start to end; hold it yourself while changing weights in place."""
        self.eos_token_ids = _eos_ids(model, tokenizer)
        pad = tokenizer.pad_token_id
        self._pad_id = pad if pad is not None else min(self.eos_token_ids, default=0)
        self._vocab_size = model.get_input_embeddings().weight.shape[0]
        self._logits_to_keep = accepts_logits_to_keep(model)
        self._queues: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopQueue] = (
            weakref.WeakKeyDictionary()
        )
        self._queues_lock = threading.Lock()
        self._closed = False
        on_cuda = self.device.type == "cuda"
        self.cuda_graphs = on_cuda if cuda_graphs is None else bool(cuda_graphs) and on_cuda
        self.static_cache = (on_cuda or self.cuda_graphs) if static_cache is None else bool(static_cache)
        self._static: Any = None  # static_decode.StaticDecoder, made at the first batch it serves
        self._merger: Any = None  # weight_payload.LoraMerger, made at the first LoRA push

    @classmethod
    def from_pretrained(
        cls, model: str, *, dtype: str = "auto", device: str | Any = "auto", **kw: Any
    ) -> HFEngine:
        """Load ``model`` ("tiny", a local folder or a hub id) through ``bridges.models.hardware.load_causal_lm``:
        ``device``/``dtype`` as every command takes them (``auto``: CUDA in bf16 where available, else the
        CPU in fp32)."""
        from transformers import AutoTokenizer

        from bridges.models.hardware import load_causal_lm, placement
        from bridges.models.tiny import resolve_model_path

        path = resolve_model_path(model)
        where = placement(str(device), dtype)
        tokenizer = AutoTokenizer.from_pretrained(path)
        kw.setdefault("name", model)
        model = load_causal_lm(path, where).requires_grad_(False)  # a sampler: no gradient ever
        return cls(model, tokenizer, device=where.device, **kw)

    # ----------------------------------------------------------------------------------------------
    # generation

    async def generate(self, prompt_ids: list[int], params: SamplingParams, n: int = 1) -> list[Sample]:
        """Sample ``n`` continuations of ``prompt_ids``; batched with every other pending request.

        Each logprob is ``log_softmax(logits / temperature)`` at the sampled id (raw logits when the
        temperature is 0), the distribution the id was drawn from and the one the trainer's importance
        ratio recomputes; top-k/top-p restrict the draw but are not renormalised in (see sampling.py).
        """
        if self._closed:
            raise EngineError(f"engine '{self.name}' is closed; create a new one to generate.")
        rows = self._rows(prompt_ids, params, n)
        loop = asyncio.get_running_loop()
        request = _Request(rows, loop.create_future())
        request.future.add_done_callback(functools.partial(_abandon_if_cancelled, rows))
        queue = self._queue(loop)
        queue.pending.append(request)
        self.stats.requests += 1
        if queue.worker is None or queue.worker.done():
            queue.worker = loop.create_task(self._serve(queue), name=f"{self.name}-batcher")
        return await request.future

    def _rows(self, prompt_ids: list[int], params: SamplingParams, n: int) -> list[Any]:
        from bridges.adapters.hf.decode import RowRequest
        from bridges.adapters.hf.sampling import row_seed

        prompt = list(prompt_ids)
        if not prompt:
            raise InvalidRequestError("prompt_ids is empty; the engine needs at least one prompt token.")
        if len(prompt) >= self.max_model_len:
            raise PromptTooLongError(
                f"The prompt has {len(prompt)} tokens but the context window (max_model_len) is "
                f"{self.max_model_len}, which leaves no room to generate; shorten the prompt."
            )
        low, high = min(prompt), max(prompt)
        if low < 0 or high >= self._vocab_size:
            bad = low if low < 0 else high
            raise InvalidRequestError(
                f"prompt_ids contains {bad}, outside the vocabulary [0, {self._vocab_size})."
            )
        if not isinstance(n, int) or n < 1:
            raise InvalidRequestError(f"n must be a positive integer, got {n!r}.")
        if params.max_tokens < 1:
            raise InvalidRequestError(f"max_tokens must be at least 1, got {params.max_tokens}.")
        if params.temperature < 0:
            raise InvalidRequestError(f"temperature must be >= 0, got {params.temperature}.")
        if not 0 < params.top_p <= 1:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {params.top_p}.")
        if not 0 <= params.top_logprobs <= min(MAX_TOP_LOGPROBS, self._vocab_size):
            raise InvalidRequestError(
                f"top_logprobs must be from 0 to {MAX_TOP_LOGPROBS}, got {params.top_logprobs}."
            )
        max_new = min(params.max_tokens, self.max_model_len - len(prompt))
        stop_ids = frozenset(self.eos_token_ids) | frozenset(params.stop_token_ids)
        return [
            RowRequest(
                prompt_ids=prompt,
                params=params,
                max_new_tokens=max_new,
                seed=None if params.seed is None else row_seed(params.seed, i),
                stop_token_ids=stop_ids,
            )
            for i in range(n)
        ]

    def _queue(self, loop: asyncio.AbstractEventLoop) -> _LoopQueue:
        with self._queues_lock:
            queue = self._queues.get(loop)
            if queue is None:
                queue = self._queues[loop] = _LoopQueue(loop)
            return queue

    async def _serve(self, queue: _LoopQueue) -> None:
        """This loop's batcher: take up to max_batch_size pending rows, run them in a thread, repeat."""
        await asyncio.sleep(0)  # one more tick for requests started alongside the first one
        while queue.pending:
            batch = self._take_batch(queue)
            if not batch:
                continue
            try:
                rows = [r.rows[i] for r, i in batch]
                results, version = await asyncio.to_thread(bound(self.device, self._run_batch), rows)
            except asyncio.CancelledError:
                _fail(batch, EngineError(f"engine '{self.name}' was shut down during generation."))
                raise
            except Exception as exc:
                _fail(
                    batch, EngineError(f"engine '{self.name}' failed on a batch: {type(exc).__name__}: {exc}")
                )
                continue
            for (request, i), result in zip(batch, results, strict=True):
                request.results[i] = Sample(
                    result.token_ids, result.logprobs, result.finish_reason, version, result.stop_str,
                    result.top_logprobs,
                )
                request.remaining -= 1
                if request.remaining == 0 and not request.future.done():
                    request.future.set_result(list(request.results))  # type: ignore[arg-type]

    def _take_batch(self, queue: _LoopQueue) -> list[tuple[_Request, int]]:
        batch: list[tuple[_Request, int]] = []
        while queue.pending and len(batch) < self.max_batch_size:
            request = queue.pending[0]
            if request.future.done():  # cancelled by its caller: nothing to compute
                queue.pending.popleft()
                continue
            take = min(len(request.rows) - request.taken, self.max_batch_size - len(batch))
            batch.extend((request, i) for i in range(request.taken, request.taken + take))
            request.taken += take
            if request.taken == len(request.rows):
                queue.pending.popleft()
        return batch

    def _run_batch(self, rows: list[Any]) -> tuple[list[Any], int]:
        with self.weight_lock:
            version = self.weight_version
            static = self._static_decoder() if not any(r.params.top_logprobs for r in rows) else None
            results = static.generate(rows) if static is not None else self._loop(rows)
            stats = self.stats
            stats.batches += 1
            stats.rows += len(rows)
            stats.max_batch_rows = max(stats.max_batch_rows, len(rows))
            stats.prompt_tokens += sum(len(r.prompt_ids) for r in rows)
            stats.tokens += sum(len(r.token_ids) for r in results)
        return results, version

    def _loop(self, rows: list[Any]) -> list[Any]:
        from bridges.adapters.hf.decode import generate_batch

        return generate_batch(self.model, self.tokenizer, rows, pad_token_id=self._pad_id, device=self.device,
                              logits_to_keep=self._logits_to_keep)

    def _static_decoder(self) -> Any:
        """The fixed-shape decoder when this engine uses it and the model passes its probe (under
        ``weight_lock``); None sends batches to the eager loop, and says why once."""
        if not self.static_cache:
            return None
        if self._static is None:
            from bridges.adapters.hf.static_decode import StaticDecoder, probe, supported

            why = supported(self.model)
            self._static = StaticDecoder(self.model, self.tokenizer, max_rows=self.max_batch_size,
                                         pad_token_id=self._pad_id, device=self.device, cuda_graphs=self.cuda_graphs)
            if why is None:
                why = probe(self._static, self._loop)
            if why is not None:
                logger.warning("engine '%s' decodes with the eager loop: %s.", self.name, why)
                self._static.verified = False
        return self._static if self._static.verified is not False else None

    # ----------------------------------------------------------------------------------------------
    # weights

    def update_weights(self, state_dict: dict[str, Any], version: int | None = None, *, verify: bool = False) -> int:
        """Copy ``state_dict`` (all or some of the model's tensors, by name) into the model.

        Every name and shape is checked before anything is copied, and the copy happens under
        ``weight_lock``, so a batch sees either the old or the new weights, never a mix: a batch
        running when the update arrives finishes under the old weights and reports the old version.
        Returns the new ``weight_version``: ``version`` when given (a trainer numbering its pushes),
        else one more. ``verify`` (a server taking pushes from outside): the replaced tensors are kept on
        the host, one short forward is run on the new weights, and non-finite logits roll them back
        (``InvalidRequestError``), all under the lock, so no batch ever samples them.
        """

        with self.weight_lock:
            own = self.model.state_dict()
            unknown = [k for k in state_dict if k not in own]
            if unknown:
                raise InvalidRequestError(
                    f"update_weights got {len(unknown)} tensor(s) the engine's model does not have "
                    f"(first: '{unknown[0]}'); names must match model.state_dict()."
                )
            for key, value in state_dict.items():
                if tuple(value.shape) != tuple(own[key].shape):
                    raise InvalidRequestError(
                        f"update_weights got '{key}' with shape {tuple(value.shape)}, but the model's "
                        f"tensor has shape {tuple(own[key].shape)}."
                    )
            backup = {key: own[key].detach().to("cpu", copy=True) for key in state_dict} if verify else {}
            _copy_into(own, state_dict)
            if verify and not self._logits_finite():
                _copy_into(own, backup)
                raise InvalidRequestError(
                    "the pushed weights make the model's logits NaN or infinite on a one-token probe; they were "
                    "rolled back, and the engine samples the weights it held before."
                )
            self.weight_version = self.weight_version + 1 if version is None else version
            return self.weight_version

    def _logits_finite(self) -> bool:
        """One forward over two tokens (under ``weight_lock``): are the logits finite?"""
        import torch

        ids = torch.tensor([[self._pad_id, min(self.eos_token_ids, default=0)]], device=self.device)
        with torch.inference_mode():
            return bool(torch.isfinite(self.model(input_ids=ids).logits).all())

    async def aupdate_weights(
        self, state_dict: dict[str, Any], policy: Any = None, version: int | None = None, *, verify: bool = False
    ) -> int:
        """``update_weights`` off the event loop (it waits for the running batch to finish).

        A LoRA policy's factors (peft names, ``policy`` the peft model whose scalings they carry) are merged
        into this engine's plain copy of the base model first (``merge_adapter``).
        """
        def update() -> int:
            return self.update_weights(self.merge_adapter(state_dict, policy), version, verify=verify)

        return await asyncio.to_thread(bound(self.device, update))

    def merge_adapter(self, state_dict: dict[str, Any], policy: Any) -> dict[str, Any]:
        """``state_dict`` as this engine's own tensors: unchanged, or, when it holds a LoRA adapter's
        factors that this model (a plain copy of the base) has no parameters for, the adapted layers'
        merged weights ``W = base + scaling * B @ A``. Why merged: the engine then decodes plain linear
        layers (peft's wrapper adds ~480 ops to every decode step at 24 layers), and the merged weights are
        copied into the same tensors, so captured decode graphs stay valid. Each layer's base is kept on
        the engine's device (``LoraMerger``), so adapter k+1 replaces adapter k."""
        own = self.model.state_dict()
        if not any(".lora_A." in name and name not in own for name in state_dict):
            return state_dict
        from bridges.models.weight_payload import LoraMerger, lora_payload, lora_scalings, tied_names

        if self._merger is None:
            self._merger = LoraMerger(own, tied_names(self.model), on_device=True)
        return dict(self._merger.tensors(lora_payload(state_dict, lora_scalings(policy), version=0)))

    def mark_weights_updated(self) -> int:
        """Record that the trainer changed this engine's model in place (the same module object).

        Hold ``weight_lock`` during the in-place change to keep batches from seeing it half done.
        Returns the new ``weight_version``.
        """
        with self.weight_lock:
            self.weight_version += 1
            return self.weight_version

    # ----------------------------------------------------------------------------------------------
    # shutdown

    def close(self) -> None:
        """Refuse new requests and fail queued ones (a batch already running finishes)."""
        self._closed = True
        with self._queues_lock:
            queues = list(self._queues.values())
        for queue in queues:
            requests = list(queue.pending)
            queue.pending.clear()
            if requests and not queue.loop.is_closed():
                error = EngineError(f"engine '{self.name}' was closed before this request ran.")
                _call_in_loop(queue.loop, _fail_requests, requests, error)

    async def aclose(self) -> None:
        """``close()``, then wait for this loop's running batch to finish."""
        self.close()
        queue = self._queues.get(asyncio.get_running_loop())
        if queue is not None and queue.worker is not None and not queue.worker.done():
            await asyncio.shield(queue.worker)

    def __repr__(self) -> str:
        return (
            f"HFEngine(name={self.name!r}, device={self.device}, max_model_len={self.max_model_len}, "
            f"max_batch_size={self.max_batch_size}, static_cache={self.static_cache}, "
            f"cuda_graphs={self.cuda_graphs}, weight_version={self.weight_version})"
        )


def _copy_into(own: dict[str, Any], tensors: dict[str, Any]) -> None:
    import torch

    with torch.no_grad():
        for key, value in tensors.items():
            own[key].copy_(value.detach())


def _context_window(model: Any, tokenizer: Any) -> int:
    config = getattr(model, "config", None)
    for attr in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(config, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    value = getattr(tokenizer, "model_max_length", None)
    if isinstance(value, int) and 0 < value < 10**8:  # tokenizers without a limit report ~1e30
        return value
    raise InvalidRequestError(
        "the model config states no context window; pass max_model_len=... to HFEngine."
    )


def _eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    """The tokenizer's eos plus the generation config's (chat models often end turns with either)."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    generation = getattr(model, "generation_config", None)
    extra = getattr(generation, "eos_token_id", None)
    if isinstance(extra, int):
        ids.add(extra)
    elif isinstance(extra, list | tuple):
        ids.update(int(i) for i in extra)
    return frozenset(ids)


def _fail(batch: list[tuple[_Request, int]], error: Exception) -> None:
    _fail_requests(list({id(r): r for r, _ in batch}.values()), error)


def _fail_requests(requests: list[_Request], error: Exception) -> None:
    for request in requests:
        if not request.future.done():
            request.future.set_exception(error)


def _call_in_loop(loop: asyncio.AbstractEventLoop, func: Any, *args: Any) -> None:
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        func(*args)
    else:
        loop.call_soon_threadsafe(func, *args)
