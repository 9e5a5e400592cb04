"""An ``Engine`` that injects faults on a schedule, around a real ``HFEngine`` (fault-injection suite).

``plan`` maps the index of a ``generate`` call (0, 1, 2, ... in arrival order) to a fault:
``"transient"`` raises once (the environment retries), ``"permanent"`` raises on every retry of that
rollout, ``"hang"`` never returns (the client's timeout must end it), ``"nan"``/``"none"`` return a
sample whose logprobs contain NaN / None, ``"script:<text>"`` answers with exactly that text. Calls not in the plan go to the real engine. Faults keyed
by prompt (``plan_prompts``) hit every call whose prompt contains a marker, so a permanent fault
follows its rollout through retries.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from bridges.envs.types import Sample, SamplingParams
from bridges.runtime.errors import EngineError


class FaultyEngine:
    def __init__(
        self, inner: Any, plan: dict[int, str] | None = None, plan_prompts: dict[str, str] | None = None
    ):
        self.inner = inner
        self.tokenizer = inner.tokenizer
        self.name = "faulty"
        self.plan = dict(plan or {})
        self.plan_prompts = dict(plan_prompts or {})
        self._calls = itertools.count()
        self.injected: list[str] = []

    @property
    def weight_version(self) -> int:
        return self.inner.weight_version

    @property
    def max_model_len(self) -> int:
        return self.inner.max_model_len

    def __getattr__(self, name: str) -> Any:  # update_weights, aclose, ... reach the real engine
        return getattr(self.inner, name)

    async def generate(self, prompt_ids: list[int], params: SamplingParams, n: int = 1) -> list[Sample]:
        fault = self.plan.pop(next(self._calls), None)
        if fault is None and self.plan_prompts:
            text = self.tokenizer.decode(prompt_ids)
            marker = next((m for m in self.plan_prompts if m in text), None)
            if marker is not None:
                fault = self.plan_prompts[marker]
                if fault == "transient":  # once per marker: the retry succeeds
                    del self.plan_prompts[marker]
        if fault is None:
            return await self.inner.generate(prompt_ids, params, n)
        self.injected.append(fault)
        if fault.startswith("script:"):  # the model "says" exactly this text (malformed tool calls, ...)
            ids = self.tokenizer.encode(fault.removeprefix("script:"), add_special_tokens=False)
            ids.append(self.tokenizer.eos_token_id)
            return [Sample(ids, [-1.0] * len(ids), "stop", self.weight_version) for _ in range(n)]
        if fault in ("transient", "permanent"):
            raise EngineError(f"injected {fault} engine failure")
        if fault == "hang":
            await asyncio.Event().wait()  # never set: only the client's timeout ends this
        samples = await self.inner.generate(prompt_ids, params, n)
        bad = float("nan") if fault == "nan" else None
        return [
            Sample(s.token_ids, [*s.logprobs[:-1], bad], s.finish_reason, s.weight_version) for s in samples
        ]  # type: ignore[list-item]
