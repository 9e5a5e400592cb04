"""The transformers engine: any ``AutoModelForCausalLM`` as a batched, token-level ``Engine`` (CPU or GPU).

``HFEngine`` is what the bundled trainer samples from on a machine without vLLM, and what the tests
run every layer against with the locally built tiny model. ``PagedEngine`` is the same engine on
transformers' continuous batching (a paged KV cache): ``engine=auto`` takes it on a GPU without vLLM
where a flash-attention kernel is installed (``bridges.grpo.policy.auto_engine``). Importing this package is cheap: torch
and transformers load when an engine is created.
"""

from bridges.adapters.hf.engine import EngineStats, HFEngine, InvalidRequestError
from bridges.adapters.hf.paged_engine import PagedEngine

__all__ = ["EngineStats", "HFEngine", "InvalidRequestError", "PagedEngine"]
