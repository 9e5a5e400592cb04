"""Tinker (tinker 0.38 SDK): a sampling client as an ``Engine``, LoRA RL as ``backend=tinker``, and a
local Tinker-compatible server (``python -m bridges.adapters.tinker.server``) backed by a real LoRA model.

Importing this package imports neither tinker nor torch; each module loads what it needs.
"""
