"""Runtime: what every other part of rl-bridges may lean on, and which leans on nothing of ours.

Holds the error types, deadlines and the bounded call into user code (``usercode``), asyncio helpers,
the garbage-collector policy, process launching, the small HTTP server thread and atomic state files.

May import: the standard library and third-party packages only. Must not import any other folder of
``bridges`` (nor ``bridges.adapters``/``workflows``/``environments``): everything sits on top of it.
"""
