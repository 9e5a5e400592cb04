"""``VerlServerEngine``: verl's rollout-server client behind the token-level ``Engine`` seam.

Inside an agent loop verl hands us ``server_manager``, whose ``generate(request_id, *, prompt_ids,
sampling_params)`` is token-in/token-out and returns a ``TokenOutput`` (``token_ids``,
``log_probs``, ``stop_reason``; not the stop string vLLM matched, which is found again here). One
engine serves one trajectory: every turn goes out under the
same ``request_id``, so verl's load balancer keeps the conversation on one server (prefix cache).

verl's own sampling settings (temperature, top-p/k, the ones its trainer recomputes logprobs
under) always win over an environment's; an environment only chooses per-turn ``max_tokens`` and
stop conditions. ``rollout.response_length`` bounds the whole trajectory: the engine reports a
context window of first-prompt length + response budget, so ``EngineClient`` clamps each turn's
``max_tokens`` to what is left, and a rollout that still wants to talk ends as ``prompt_too_long``
(which the agent loop turns into an ordinary truncated trajectory).
"""

from __future__ import annotations

import uuid
from typing import Any

from bridges.envs.types import Sample, SamplingParams
from bridges.runtime.errors import UnsupportedRequestError


class VerlServerEngine:
    """An ``Engine`` over verl's ``LLMServerClient`` for one trajectory."""

    name = "verl"

    def __init__(
        self,
        server_manager: Any,
        tokenizer: Any,
        *,
        base_sampling_params: dict[str, Any],
        response_length: int,
        eos_token_ids: set[int] | None = None,
        weight_version: int = 0,
    ) -> None:
        self.server_manager = server_manager
        self.tokenizer = tokenizer
        self.base_sampling_params = dict(base_sampling_params)
        self.response_length = int(response_length)
        self.request_id = uuid.uuid4().hex  # one session per trajectory: every turn on one server
        self.weight_version = weight_version
        eos = tokenizer.eos_token_id
        self.eos_token_ids = set(eos_token_ids or ()) | ({eos} if eos is not None else set())
        self.first_prompt_len: int | None = None
        self.calls = 0

    @property
    def max_model_len(self) -> int | None:
        """The trajectory's token budget, once the first prompt is known (the client clamps turns to it)."""
        return None if self.first_prompt_len is None else self.first_prompt_len + self.response_length

    def sampling_params(self, prompt_len: int, params: SamplingParams) -> dict[str, Any]:
        used = 0 if self.first_prompt_len is None else prompt_len - self.first_prompt_len
        room = max(1, self.response_length - used)
        return {
            **self.base_sampling_params,
            "max_tokens": min(params.max_tokens, room),
            **params.stops_and_seed(),
        }

    async def generate(self, prompt_ids: list[int], params: SamplingParams, n: int = 1) -> list[Sample]:
        if params.top_logprobs:
            raise UnsupportedRequestError(
                "verl's rollout servers return only the sampled token's logprob, so top_logprobs cannot "
                "be served during verl training; drop top_logprobs."
            )
        if self.first_prompt_len is None:
            self.first_prompt_len = len(prompt_ids)
        samples = []
        for _ in range(n):  # a trajectory asks for one reply per turn; n > 1 stays on the same session
            sampling = self.sampling_params(len(prompt_ids), params)
            out = await self.server_manager.generate(
                request_id=self.request_id, prompt_ids=list(prompt_ids), sampling_params=sampling
            )
            self.calls += 1
            samples.append(self._sample(out, sampling, params))
        return samples

    def _sample(self, out: Any, sampling: dict[str, Any], params: SamplingParams) -> Sample:
        token_ids = list(out.token_ids)
        # verl recomputes old-policy logprobs itself when calculate_log_probs is off; 0.0 marks "not sent"
        logprobs = [float(x) for x in out.log_probs] if out.log_probs is not None else [0.0] * len(token_ids)
        stops = self.eos_token_ids | set(params.stop_token_ids)
        if getattr(out, "stop_reason", None) == "aborted":
            reason = "abort"
        elif token_ids and token_ids[-1] in stops:
            reason = "stop"
        elif len(token_ids) >= sampling["max_tokens"]:
            reason = "length"
        else:
            reason = "stop"  # a stop string ended it
        steps = (getattr(out, "extra_fields", None) or {}).get("global_steps")
        version = int(steps) if isinstance(steps, int) else self.weight_version  # the policy that sampled it
        stop_str = self._stop_string(token_ids, params.stop) if reason == "stop" else None
        return Sample(token_ids, logprobs, reason, version, stop_str)  # type: ignore[arg-type]

    def _stop_string(self, token_ids: list[int], stops: list[str]) -> str | None:
        """The stop string that ended the reply. verl's ``TokenOutput`` does not carry the one vLLM matched,
        so it is found again in the decoded reply (the first to occur), and the client cuts the reply's
        text there as it does on every other backend; the sampled ids stay whole."""
        if not stops:
            return None
        text = self.tokenizer.decode(token_ids, skip_special_tokens=False)
        found = [(text.find(stop), stop) for stop in stops if stop and stop in text]
        return min(found)[1] if found else None

    async def aclose(self) -> None:
        """Nothing to release: the backend owns the server or client this engine talks to."""
