"""vLLM as an ``Engine`` (GPU only; checked only on a GPU machine). Importable without vLLM installed."""

from bridges.adapters.vllm.engine import VLLMEngine, samples_from_output, sampling_kwargs

__all__ = ["VLLMEngine", "sampling_kwargs", "samples_from_output"]
