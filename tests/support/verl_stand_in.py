"""The one part of verl a CPU test stands in for: the GPU rollout server behind ``LLMServerClient``.

It answers verl's own seam, ``generate(request_id, *, prompt_ids, sampling_params) -> TokenOutput``,
with the tiny model through ``adapters.hf``, and records what it sampled per ``request_id`` so a test
can check that the ids verl trains on are exactly those. It lives in its own module (not a test
file) so Ray can unpickle it inside ``AgentLoopWorker`` actors.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any


class HFServerClient:
    """verl's ``LLMServerClient.generate`` contract over an ``HFEngine`` (created lazily: picklable for Ray)."""

    def __init__(self, model_path: str) -> None:
        self.model_path = model_path
        self.engine: Any = None
        self.sampled: dict[str, list[tuple[list[int], list[float]]]] = defaultdict(list)
        self.max_tokens: list[int] = []

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **_: Any
    ):
        from verl.workers.rollout.replica import TokenOutput

        from adapters.hf import HFEngine
        from bridges.types import SamplingParams

        if self.engine is None:
            self.engine = HFEngine.from_pretrained(self.model_path)
        params = SamplingParams(
            max_tokens=int(sampling_params["max_tokens"]),
            temperature=float(sampling_params["temperature"]),
            top_p=float(sampling_params["top_p"]),
            top_k=int(sampling_params["top_k"]),
            stop_token_ids=list(sampling_params.get("stop_token_ids", [])),
        )
        self.max_tokens.append(params.max_tokens)
        sample = (await self.engine.generate(list(prompt_ids), params))[0]
        self.sampled[request_id].append((sample.token_ids, sample.logprobs))
        return TokenOutput(token_ids=sample.token_ids, log_probs=sample.logprobs, stop_reason="completed")
