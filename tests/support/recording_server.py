"""verl's ``hf`` rollout server (``bridges.adapters.verl.hf_rollout.HFRolloutServer``), recording what
it sampled per ``request_id`` and the ``max_tokens`` it was asked for, so tests can compare what verl
trains on with what was sampled. Everything else is the real server."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from bridges.adapters.verl.hf_rollout import HFRolloutServer


class RecordingServer(HFRolloutServer):
    def __init__(self, model_path: str, response_length: int = 1 << 30) -> None:
        super().__init__(model_path, response_length)
        self.sampled: dict[str, list[tuple[list[int], list[float]]]] = defaultdict(list)
        self.max_tokens: list[int] = []

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       **kwargs: Any) -> Any:
        self.max_tokens.append(int(sampling_params.get("max_tokens") or self.response_length))
        out = await super().generate(
            request_id, prompt_ids=prompt_ids, sampling_params=sampling_params, **kwargs
        )
        self.sampled[request_id].append((list(out.token_ids), list(out.log_probs or [])))
        return out
