"""``HFServerManager``: verl's rollout-server seam answered by the transformers engine, for machines
without a GPU.

verl's agent loops reach their vLLM/SGLang servers only through ``LLMServerClient.generate(request_id,
*, prompt_ids, sampling_params) -> TokenOutput``. This class answers that same call with
``adapters.hf``, so verl's real ``AgentLoopWorker`` (and ``bridges.compare backend=verl``) runs on a
CPU with nothing else stood in for. It records what it sampled per ``request_id`` (tests read it),
and creates its engine lazily, so it pickles into verl's Ray worker actors.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from bridges.types import SamplingParams


@dataclass
class _TokenOutput:
    """The fields of verl's ``TokenOutput`` a loop reads, for when verl itself is not installed."""

    token_ids: list[int]
    log_probs: list[float] | None = None
    stop_reason: str | None = None
    extra_fields: dict[str, Any] = field(default_factory=dict)


class HFServerManager:
    """verl's ``LLMServerClient.generate`` contract over an ``HFEngine`` on ``model_path``."""

    def __init__(self, model_path: str) -> None:
        self.model_path = model_path
        self.engine: Any = None
        self.sampled: dict[str, list[tuple[list[int], list[float]]]] = defaultdict(list)
        self.max_tokens: list[int] = []

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **_: Any
    ) -> Any:
        from bridges.adapters.hf import HFEngine

        if self.engine is None:
            self.engine = HFEngine.from_pretrained(self.model_path)
        params = SamplingParams(
            max_tokens=int(sampling_params["max_tokens"]),
            temperature=float(sampling_params.get("temperature", 1.0)),
            top_p=float(sampling_params.get("top_p", 1.0)),
            top_k=int(sampling_params.get("top_k", -1)),
            stop=list(sampling_params.get("stop", [])),
            stop_token_ids=list(sampling_params.get("stop_token_ids", [])),
            seed=sampling_params.get("seed"),
        )
        self.max_tokens.append(params.max_tokens)
        sample = (await self.engine.generate(list(prompt_ids), params))[0]
        self.sampled[request_id].append((sample.token_ids, sample.logprobs))
        output_type: Any = _TokenOutput
        try:
            from verl.workers.rollout.replica import TokenOutput

            output_type = TokenOutput
        except ImportError:
            pass
        return output_type(token_ids=sample.token_ids, log_probs=sample.logprobs, stop_reason="completed")
