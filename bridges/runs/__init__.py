"""Runs: what a training or evaluation run is configured with, checked against, and records.

Holds config parsing (``config``, ``train_config``), the declared dotted-path seams to backends and
engines (``backends``, ``engines``: data, not imports), the checks every run makes before it spends
time (``preflight``) and the metrics file (``metrics``).

May import: ``bridges.runtime``, ``bridges.envs``, ``bridges.models``, ``bridges.client``. Must not
import ``bridges.adapters``/``workflows``/``environments`` or the applications above them
(``grpo``, ``server``, ``jobs``, the commands): backends are reached through the seam tables only.
"""
