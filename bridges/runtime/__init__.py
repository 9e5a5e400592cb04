"""Runtime: what every other part of rl-bridges may lean on, and which leans on nothing of ours.

Holds the error types, deadlines and the bounded call into user code (``usercode``), asyncio helpers,
the garbage-collector policy, process launching (and ``isolate``: a command that cannot see the
processes that started it), the small HTTP server thread, atomic state files, and the one rule every
JSON document a server reads is held to (``json_rules``: depth, valid Unicode).

May import: the standard library and third-party packages only. Must not import any other folder of
``bridges`` (nor ``bridges.adapters``/``workflows``/``environments``): everything sits on top of it.
"""
