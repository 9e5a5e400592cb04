"""``TinkerEngine``: a Tinker ``SamplingClient`` behind the token-level ``Engine`` seam.

Token in, token out: the prompt goes as ``ModelInput.from_ints`` and the ``n`` samples of a
request come back in one ``sample`` call with a logprob per sampled token and a stop reason. Tool
calls need nothing here: ``EngineClient`` parses them from the sampled text and renders tool
results into the next prompt with the ledger, so tool environments work on Tinker too.

Stops: Tinker takes either strings or token ids, not both, and ``None`` means "the model's EOS".
Token stops are sent with the EOS ids added, so asking for an extra stop token never silently
turns EOS off.
"""

from __future__ import annotations

from typing import Any

from bridges.envs.types import Sample, SamplingParams
from bridges.runtime.errors import ConfigError, UnsupportedRequestError


def tinker_sampling_params(params: SamplingParams, eos_ids: set[int]) -> dict[str, Any]:
    """Our sampling parameters as keyword arguments for ``tinker.types.SamplingParams``."""
    if params.top_logprobs:
        raise UnsupportedRequestError(
            "the Tinker engine returns only the sampled token's logprob, so top_logprobs cannot be "
            "served; drop top_logprobs (or use the hf or vllm engine)."
        )
    if params.stop and params.stop_token_ids:
        raise ConfigError(
            "Tinker takes stop strings or stop token ids in one request, not both; pass only one kind."
        )
    stop: Any = None
    if params.stop:
        stop = list(params.stop)
    elif params.stop_token_ids:
        stop = sorted(set(params.stop_token_ids) | eos_ids)
    return {
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,
        "seed": params.seed,
        "stop": stop,
    }


class TinkerEngine:
    """An ``Engine`` over one Tinker sampling client (one set of policy weights)."""

    name = "tinker"

    def __init__(
        self,
        sampling_client: Any,
        tokenizer: Any,
        *,
        weight_version: int = 0,
        max_model_len: int | None = None,
    ):
        self.sampling_client = sampling_client
        self.tokenizer = tokenizer
        self.weight_version = weight_version
        self.max_model_len = max_model_len
        eos = tokenizer.eos_token_id
        self.eos_ids = {eos} if eos is not None else set()

    async def generate(self, prompt_ids: list[int], params: SamplingParams, n: int = 1) -> list[Sample]:
        from tinker import types

        version = self.weight_version
        response = await self.sampling_client.sample(
            types.ModelInput.from_ints(list(prompt_ids)),
            num_samples=n,
            sampling_params=types.SamplingParams(**tinker_sampling_params(params, self.eos_ids)),
        )
        samples = []
        for sequence in response.sequences:
            tokens = list(sequence.tokens)
            logprobs = sequence.logprobs
            if logprobs is None or len(logprobs) != len(tokens):
                raise ConfigError("the Tinker sampler returned no logprob per sampled token; RL needs them.")
            samples.append(Sample(tokens, [float(x) for x in logprobs], sequence.stop_reason, version))
        return samples

    async def aclose(self) -> None:
        """Nothing to release: the backend owns the server or client this engine talks to."""
