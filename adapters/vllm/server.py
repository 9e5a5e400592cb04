"""``VLLMServerEngine``: a running OpenAI-compatible vLLM server behind the token-level ``Engine`` seam.

This is how a trainer that owns a vLLM *server* (TRL's ``vllm_mode="server"``, a separate
``vllm serve``) is turned into an ``EngineClient``: prompts go to ``/v1/completions`` as token ids,
never as text, so the server's chat template never re-renders the conversation, and the sampled
ids come back with ``return_token_ids`` and their logprobs with ``logprobs=0``. The request uses
only fields ``bridges.serve`` understands as well, which is what CPU tests run it against; the
real vLLM server is checked only on a GPU machine.
"""

from __future__ import annotations

from typing import Any

from bridges.envs.types import Sample, SamplingParams
from bridges.runtime.errors import EngineError


def completion_body(model: str, prompt_ids: list[int], params: SamplingParams, n: int) -> dict[str, Any]:
    """The JSON body of a token-in, token-out ``/v1/completions`` request."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": list(prompt_ids),
        "n": n,
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "logprobs": 0,  # the sampled token's logprob only
        "return_token_ids": True,
    }
    if params.top_k > 0:
        body["top_k"] = params.top_k
    return {**body, **params.stops_and_seed()}


def samples_from_completion(reply: dict[str, Any], weight_version: int) -> list[Sample]:
    """A ``/v1/completions`` JSON reply -> our samples, or one sentence saying what is missing."""
    samples = []
    for choice in sorted(reply.get("choices", []), key=lambda c: c.get("index", 0)):
        token_ids = choice.get("token_ids")
        logprobs = (choice.get("logprobs") or {}).get("token_logprobs")
        if token_ids is None or logprobs is None or len(logprobs) != len(token_ids):
            raise EngineError(
                "the server's completion carries no token ids or no logprob per token; a vLLM server must "
                "accept return_token_ids and logprobs=0 (vLLM >= 0.10)."
            )
        reason = choice.get("finish_reason")
        stop = choice.get("stop_reason")
        samples.append(
            Sample(
                list(token_ids),
                [float(x) for x in logprobs],
                reason if reason in ("stop", "length") else "abort",
                weight_version,
                stop if isinstance(stop, str) else None,
            )
        )
    return samples


class VLLMServerEngine:
    """An ``Engine`` over an OpenAI-compatible server that returns token ids (vLLM, or ``bridges.serve``)."""

    name = "vllm-server"

    def __init__(
        self,
        base_url: str,
        tokenizer: Any,
        *,
        model: str | None = None,
        api_key: str = "EMPTY",
        timeout: float = 600.0,
        weight_version: int = 0,
        max_model_len: int | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.tokenizer = tokenizer
        self.model = model
        self.weight_version = weight_version
        self.max_model_len = max_model_len
        self._headers = {"Authorization": f"Bearer {api_key}"}
        self._timeout = timeout
        self._http: Any = None

    def _client(self) -> Any:
        import httpx2 as httpx  # the HTTP client the openai SDK already brings

        if self._http is None:  # created inside the event loop that uses it
            self._http = httpx.AsyncClient(
                base_url=self.base_url, headers=self._headers, timeout=self._timeout
            )
        return self._http

    async def _model_name(self) -> str:
        if self.model is None:
            reply = await self._client().get("/v1/models")
            reply.raise_for_status()
            models = reply.json().get("data") or []
            if not models:
                raise EngineError(f"the server at {self.base_url} lists no model under /v1/models.")
            self.model = str(models[0]["id"])
        return self.model

    async def generate(self, prompt_ids: list[int], params: SamplingParams, n: int = 1) -> list[Sample]:
        import httpx2 as httpx  # the HTTP client the openai SDK already brings

        version = self.weight_version
        body = completion_body(await self._model_name(), prompt_ids, params, n)
        try:
            reply = await self._client().post("/v1/completions", json=body)
        except httpx.HTTPError as exc:
            raise EngineError(f"the server at {self.base_url} did not answer: {exc}.") from exc
        if reply.status_code != 200:
            raise EngineError(
                f"the server at {self.base_url} answered {reply.status_code}: {reply.text[:300]}"
            )
        return samples_from_completion(reply.json(), version)

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None
