"""A remote OpenAI-compatible endpoint as the model under evaluation (evaluation and comparison only).

A remote API returns text, not the token ids the policy sampled, so nothing it produces can be
trained on without re-tokenising (which is exactly the retokenisation drift the token ledger
exists to avoid). This adapter therefore stays a plain ``openai.AsyncOpenAI`` and every result it
feeds is labelled ``token_ids: false`` by its callers.
"""

from __future__ import annotations

import os
from typing import Any

from bridges.runtime.errors import ConfigError

DEFAULT_BASE_URL = "https://api.openai.com/v1"


def build_openai_client(
    base_url: str | None = None,
    api_key_var: str = "OPENAI_API_KEY",
    *,
    timeout: float = 600.0,
    max_retries: int = 2,
) -> Any:
    """An ``openai.AsyncOpenAI`` for ``base_url`` with the key read from the ``api_key_var`` variable.

    The key is read from the environment, never from the command line, so it does not end up in
    shell history or in the run's saved metadata. Every request is bounded by ``timeout`` seconds.
    """
    import openai

    api_key = os.environ.get(api_key_var)
    if not api_key:
        raise ConfigError(
            f"engine=openai needs an API key in the environment variable {api_key_var}; export it "
            f"(or name another variable with api_key_var=<NAME>)."
        )
    return openai.AsyncOpenAI(
        base_url=base_url or DEFAULT_BASE_URL, api_key=api_key, timeout=timeout, max_retries=max_retries
    )
