"""Server: the OpenAI-compatible HTTP face of an engine (``python -m bridges.serve``).

Holds the app and its endpoints (``app``) and the request schemas published at ``/openapi.json``
(``schema``).

May import: every layer below the applications (runtime, envs, models, client, runs, and the installed
``bridges.adapters``/``workflows``/``environments``). Must not import the commands, ``grpo`` or ``jobs``.
"""
