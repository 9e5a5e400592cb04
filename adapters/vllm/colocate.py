"""``VLLMColocateEngine``: a synchronous ``vllm.LLM`` living in the trainer's process, as an ``Engine``.

TRL's ``vllm_mode="colocate"`` (and any script holding a ``vllm.LLM``) has no server to send
requests to, and ``LLM.generate`` is a blocking call over a list of prompts. Rollouts, though, ask
for one turn at a time, concurrently. This engine gathers the requests that arrive while the loop
is busy into one ``LLM.generate`` call (run off the event loop), so a turn of every rollout in a
step is one vLLM batch. Checked only on a GPU machine; CPU tests drive the batching through a
stand-in object with ``LLM.generate``'s signature and vLLM's ``RequestOutput`` shape.
"""

from __future__ import annotations

import asyncio
from typing import Any

from bridges.adapters.vllm.engine import samples_from_output, sampling_kwargs
from bridges.envs.types import Sample, SamplingParams


def _vllm_inputs(prompts: list[list[int]], params: list[tuple[SamplingParams, int]]) -> tuple[list, list]:
    import vllm

    return (
        [{"prompt_token_ids": list(ids)} for ids in prompts],
        [vllm.SamplingParams(**sampling_kwargs(p, n)) for p, n in params],
    )


class VLLMColocateEngine:
    """An ``Engine`` over an in-process ``vllm.LLM``; concurrent requests share one ``generate`` call."""

    name = "vllm-colocate"

    def __init__(
        self, llm: Any, tokenizer: Any, *, weight_version: int = 0, build_inputs: Any = None
    ) -> None:
        self.llm = llm
        self.tokenizer = tokenizer
        self.weight_version = weight_version
        self._build_inputs = build_inputs or _vllm_inputs  # how our params become vLLM's objects
        self._pending: list[tuple[list[int], SamplingParams, int, asyncio.Future[list[Sample]]]] = []
        self._flush: asyncio.Task[None] | None = None
        self.batches = 0  # LLM.generate calls made (the tests read it)

    async def generate(self, prompt_ids: list[int], params: SamplingParams, n: int = 1) -> list[Sample]:
        future: asyncio.Future[list[Sample]] = asyncio.get_running_loop().create_future()
        self._pending.append((list(prompt_ids), params, n, future))
        if self._flush is None or self._flush.done():
            self._flush = asyncio.create_task(self._run_pending())
        return await future

    async def _run_pending(self) -> None:
        await asyncio.sleep(0)  # let every rollout that is ready this tick queue its request
        while self._pending:
            batch, self._pending = self._pending, []
            version = self.weight_version
            prompts, params = self._build_inputs([b[0] for b in batch], [(b[1], b[2]) for b in batch])
            try:
                outputs = await asyncio.to_thread(self.llm.generate, prompts, params, use_tqdm=False)
                self.batches += 1
                for (_, _, _, future), output in zip(batch, outputs, strict=True):
                    if not future.done():
                        future.set_result(samples_from_output(output, version))
            except Exception as exc:  # every waiting rollout learns of the failure; none hangs
                for _, _, _, future in batch:
                    if not future.done():
                        future.set_exception(exc)

    async def aclose(self) -> None:
        """Nothing to release: the backend owns the server or client this engine talks to."""
