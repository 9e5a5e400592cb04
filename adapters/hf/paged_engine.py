"""``PagedEngine``: the transformers engine on transformers' own continuous batching (a paged KV cache).

Why it exists: ``HFEngine`` decodes one left-padded batch at a time, so a batch runs as long as its
longest row and requests that arrive mid-batch wait for the next one. transformers (5.10+) ships a
continuous-batching manager with a paged KV cache: rows join and leave the running batch at every
step, prompts sharing full cache blocks share them, and on CUDA the steps can run as CUDA graphs.
It runs on the module it is given, so the engine keeps the same own copy of the weights as
``HFEngine`` and takes pushed tensors the same way.

Contract, and where it differs from ``HFEngine``:
- ``Sample.logprobs`` are computed by transformers after its logits warpers: with top-k/top-p unset
  (the trainer's default) that is ``log_softmax(logits / temperature)``, the distribution the
  trainer's importance ratio recomputes; with top-k/top-p set it is the renormalised truncated
  distribution the id was really drawn from (``HFEngine`` reports the untruncated one). Temperature
  0 runs greedy (argmax) with ``log_softmax(logits)``, as ``HFEngine`` does.
- The warpers are chosen once per manager (temperature, top-k and top-p are values per request, but
  whether top-k/top-p run at all is fixed when the manager starts, and both sort the vocabulary at
  every step). A request that needs another set waits until the running rows finish, then the
  manager restarts with that set: the trainer's rollouts all share one set, so this is rare.
- A request's ``seed`` is accepted but cannot make its sample reproducible: every row draws from the
  manager's one generator in whatever batch it shares. ``top_logprobs`` (alternatives per position)
  are not computed by transformers: such requests run through ``HFEngine``'s own decode loop, after
  the manager has stopped (it switches the module's attention, which that loop cannot use).
- Stop strings are found after the row ends (transformers stops on token ids only) and the sample is
  cut at the token that completes the first one, so it holds exactly the ids ``HFEngine`` returns.
- Weight updates wait until no row is running and hold new rows back while they copy, so every
  token of a sample was drawn under the ``weight_version`` stamped on it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from bridges.adapters.hf.engine import HFEngine, InvalidRequestError
from bridges.envs.types import Sample, SamplingParams
from bridges.models.hardware import bound
from bridges.runtime.errors import EngineError


@dataclass(frozen=True, slots=True)
class WarperSet:
    """Which logits warpers a manager runs (their values are per request)."""

    greedy: bool
    top_k: bool
    top_p: bool

    @classmethod
    def of(cls, params: SamplingParams) -> WarperSet:
        greedy = params.temperature == 0
        return cls(greedy, not greedy and params.top_k > 0, not greedy and params.top_p < 1)


@dataclass(eq=False)
class _Group:
    """One ``generate`` call: its rows run as separate requests, the call resolves when all have."""

    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[list[Sample]]
    rows: list[Any]  # decode.RowRequest
    version: int = 0
    request_ids: list[str] = field(default_factory=list)
    results: list[Sample | None] = field(default_factory=list)
    remaining: int = 0


class PagedEngine(HFEngine):
    """An ``Engine`` over transformers' continuous batching (paged KV cache) on a causal LM."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_batch_size: int = 64,
        device: str | Any = "cpu",
        max_model_len: int | None = None,
        name: str = "paged",
        cache_tokens: int | None = None,
        block_size: int | None = None,
        reserve_bytes: int = 0,
        cuda_graphs: bool | None = None,
    ) -> None:
        # the manager runs the steps (CUDA graphs there when cuda_graphs, default on CUDA); HFEngine's own
        # decode serves only top_logprobs requests, in its eager loop
        super().__init__(model, tokenizer, max_batch_size=max_batch_size, device=device,
                         max_model_len=max_model_len, name=name, static_cache=False, cuda_graphs=cuda_graphs)
        if cache_tokens is not None and cache_tokens < 1:
            raise InvalidRequestError(f"cache_tokens must be at least 1, got {cache_tokens}.")
        self.cache_tokens = cache_tokens
        self.block_size = block_size
        self.reserve_bytes = reserve_bytes  # what the trainer will still allocate on this GPU
        # a failed step reaches each caller as one EngineError sentence; transformers would also log
        # the traceback of its generation thread on every failure
        logging.getLogger("ContinuousBatchingLogger").setLevel(logging.CRITICAL)
        self._manager: Any = None
        self._collector: threading.Thread | None = None
        self._warpers: WarperSet | None = None
        self._generation = 0  # which manager a running row belongs to
        self._running: dict[str, tuple[_Group, int, int]] = {}  # request id -> (group, row, manager)
        self._exclusive_holders = 0  # weight updates and HFEngine batches waiting for or holding the model
        self._switch_wanted = False  # a request waits for another warper set: hold same-set rows back
        self._restarting = False  # a manager is being replaced (its old collector joins with _cv released)
        self._cv = threading.Condition()
        self._ids = itertools.count()

    # ----------------------------------------------------------------------------------------------
    # generation

    async def generate(self, prompt_ids: list[int], params: SamplingParams, n: int = 1) -> list[Sample]:
        """Sample ``n`` continuations; each row joins the running batch at the next decode step."""
        if self._closed:
            raise EngineError(f"engine '{self.name}' is closed; create a new one to generate.")
        if params.top_logprobs:
            return await super().generate(prompt_ids, params, n)
        rows = self._rows(prompt_ids, params, n)
        loop = asyncio.get_running_loop()
        group = _Group(loop, loop.create_future(), rows, results=[None] * n, remaining=n)
        self.stats.requests += 1
        await asyncio.to_thread(bound(self.device, self._submit), group, params)
        try:
            return await group.future
        except asyncio.CancelledError:
            self._cancel(group)
            raise

    def _submit(self, group: _Group, params: SamplingParams) -> None:
        """Admit the group's rows to the manager running ``params``' warper set (restarting it if needed)."""
        warpers = WarperSet.of(params)
        with self._cv:
            while True:
                if self._closed:
                    raise EngineError(f"engine '{self.name}' was closed before this request ran.")
                idle = not self._running
                same = self._warpers == warpers and self._alive()
                free = not self._exclusive_holders and not self._restarting
                if free and ((same and not self._switch_wanted) or idle):
                    break
                if not same and not idle:
                    self._switch_wanted = True
                self._cv.wait()
            if not (self._warpers == warpers and self._alive()):
                try:
                    self._restart(warpers)
                except Exception as exc:  # a cache that does not fit, an unsupported model
                    raise EngineError(
                        f"engine '{self.name}' could not start transformers' continuous batching "
                        f"({type(exc).__name__}: {exc}); use engine=hf."
                    ) from exc
            self._switch_wanted = False
            group.version = self.weight_version
            manager, generation = self._manager, self._generation
            for i in range(len(group.rows)):
                request_id = f"{self.name}-{next(self._ids)}"
                group.request_ids.append(request_id)
                self._running[request_id] = (group, i, generation)
        for request_id, row in zip(group.request_ids, group.rows, strict=True):
            manager.add_request(
                row.prompt_ids, request_id=request_id, max_new_tokens=row.max_new_tokens,
                eos_token_id=sorted(row.stop_token_ids), **_per_request(params),
            )

    def _alive(self) -> bool:
        """A manager runs: its loop ends on a failed step (a NaN distribution, an out-of-memory), failing
        its rows, and the next request then starts a fresh one instead of queueing on a dead loop."""
        return self._manager is not None and self._manager.is_running()

    def _cancel(self, group: _Group) -> None:
        """The caller gave up: its rows leave the batch at the next step."""
        with self._cv:
            cancelled = [rid for rid in group.request_ids if self._running.pop(rid, None) is not None]
            self._cv.notify_all()
            manager = self._manager
        for request_id in cancelled:
            if manager is not None:
                manager.cancel_request(request_id)

    # ----------------------------------------------------------------------------------------------
    # the manager and its results

    def _restart(self, warpers: WarperSet) -> None:
        """Stop the running manager (no row runs: the caller checked under ``_cv``) and start one for
        ``warpers``, with a thread that hands its results to the waiting calls."""
        from bridges.adapters.hf.paged_manager import start_manager

        self._restarting = True
        try:
            self._stop_manager()
            self._generation += 1
            self._manager = start_manager(self, warpers)
        finally:
            self._restarting = False
        self._warpers = warpers
        generation = self._generation
        self._collector = threading.Thread(target=self._collect, args=(self._manager, generation), daemon=True,
                                           name=f"{self.name}-results-{generation}")
        self._collector.start()

    def _stop_manager(self, hard: bool = False) -> None:
        """Stop the manager (``hard``: its unfinished rows fail) and give the module its attention back."""
        manager, self._manager, self._warpers = self._manager, None, None
        if manager is not None:
            manager.stop(block=True, timeout=30, hard_stop=hard)
            manager.destroy()
        collector, self._collector = self._collector, None
        while collector is not None and collector.is_alive():  # it takes _cv to fail the rows it lost
            self._cv.wait(0.05)

    def _collect(self, manager: Any, generation: int) -> None:
        """Deliver this manager's finished rows until it stops; rows it never finished fail."""
        while True:
            output = manager.get_result(timeout=0.1)
            if output is not None:
                if output.is_finished() or output.error is not None:
                    self._deliver(output)
                continue
            if not manager.is_running():
                break
        error = EngineError(f"engine '{self.name}': the generation loop stopped before this row finished.")
        with self._cv:
            lost = [rid for rid, (_, _, gen) in self._running.items() if gen == generation]
            groups = {id(self._running[rid][0]): self._running.pop(rid)[0] for rid in lost}
            self._cv.notify_all()
        for group in groups.values():
            _resolve(group, error)

    def _deliver(self, output: Any) -> None:
        from bridges.adapters.hf.paged_manager import to_sample

        with self._cv:
            entry = self._running.pop(output.request_id, None)
            self._cv.notify_all()
        if entry is None:  # cancelled by its caller
            return
        group, index, _ = entry
        if output.error is not None:
            _resolve(group, EngineError(f"engine '{self.name}' failed on a row: {output.error}"))
            return
        sample = to_sample(self, group.rows[index], output, group.version)
        self.stats.rows += 1
        self.stats.tokens += len(sample.token_ids)
        self.stats.prompt_tokens += len(group.rows[index].prompt_ids)
        group.results[index] = sample
        group.remaining -= 1
        if group.remaining == 0:
            _resolve(group, None)

    # ----------------------------------------------------------------------------------------------
    # the model to oneself: weight updates, and HFEngine's decode loop for top_logprobs

    @contextmanager
    def _model_alone(self, stop_manager: bool) -> Iterator[None]:
        """Hold new rows back, wait until none runs, and (for HFEngine's loop) stop the manager, which
        gives the module its own attention back."""
        with self._cv:
            self._exclusive_holders += 1
            try:
                while self._running:
                    self._cv.wait()
                if stop_manager:
                    self._stop_manager()
            except BaseException:
                self._exclusive_holders -= 1
                self._cv.notify_all()
                raise
        try:
            yield
        finally:
            with self._cv:
                self._exclusive_holders -= 1
                self._cv.notify_all()

    def _run_batch(self, rows: list[Any]) -> tuple[list[Any], int]:
        with self._model_alone(stop_manager=True):
            return super()._run_batch(rows)

    def update_weights(self, state_dict: dict[str, Any], version: int | None = None, *, verify: bool = False) -> int:
        """``HFEngine.update_weights`` once no row is running (new rows wait for the copy)."""
        with self._model_alone(stop_manager=False):
            return super().update_weights(state_dict, version, verify=verify)

    def mark_weights_updated(self) -> int:
        with self._model_alone(stop_manager=False):
            return super().mark_weights_updated()

    # ----------------------------------------------------------------------------------------------
    # shutdown

    def close(self) -> None:
        """Refuse new requests, fail running rows, stop the manager (its thread ends)."""
        super().close()
        with self._cv:
            self._cv.notify_all()
            self._stop_manager(hard=True)

    async def aclose(self) -> None:
        await asyncio.to_thread(bound(self.device, self.close))
        await super().aclose()

    def __repr__(self) -> str:
        return (
            f"PagedEngine(name={self.name!r}, device={self.device}, max_model_len={self.max_model_len}, "
            f"warpers={self._warpers}, weight_version={self.weight_version})"
        )


def _per_request(params: SamplingParams) -> dict[str, Any]:
    """The warper values one request carries (the manager's set decides which of them run)."""
    if params.temperature == 0:
        return {}
    values: dict[str, Any] = {"temperature": float(params.temperature)}
    if params.top_k > 0:
        values["top_k"] = int(params.top_k)
    if params.top_p < 1:
        values["top_p"] = float(params.top_p)
    return values


def _resolve(group: _Group, error: Exception | None) -> None:
    """Settle the call's future on its own loop (results arrive on the collector thread)."""

    def settle() -> None:
        if group.future.done():
            return
        if error is not None:
            group.future.set_exception(error)
        else:
            group.future.set_result(list(group.results))  # type: ignore[arg-type]

    if not group.loop.is_closed():
        group.loop.call_soon_threadsafe(settle)
