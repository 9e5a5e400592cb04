"""Adapters: one module or subpackage per engine or training backend (hf, vllm, openai, trl, verl, tinker, verifiers).

An adapter is the only place that knows a backend's API. Engine adapters implement the token-level
``bridges.envs.types.Engine`` seam (prompt ids in, sampled ids + logprobs out), so the client layer and
every environment run unchanged on any of them; backend adapters turn rollouts into what a trainer
consumes. Each imports its backend lazily and, when it is missing, fails with one sentence naming the
extra to install, so ``import adapters`` (like ``import bridges``) stays light.
"""
