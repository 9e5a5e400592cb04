"""The bundled reference GRPO trainer (``backend=grpo``); the loop is in ``trainer.py``.

May import: every layer below the applications (runtime, envs, models, client, runs, and the installed
``bridges.adapters``/``workflows``/``environments``). Must not import the commands, ``server`` or ``jobs``.
"""
