"""Jobs: the work behind the commands — starting a training run (validation, then its backend),
evaluate, compare, rescore, export, SFT, template check, environment scaffold — and the fidelity run.

A command at the root of ``bridges`` parses its arguments and calls one function here.

May import: every layer below the applications (runtime, envs, models, client, runs, and the installed
``bridges.adapters``/``workflows``/``environments``). Must not import the commands, ``grpo`` or ``server``.
"""
