"""Finding a test's own processes by a mark in their environment.

Children inherit their launcher's environment (verifiers' subprocess runtime passes it on too), so a
test that puts a unique ``NAME=value`` in a job's environment can tell that job's processes, orphans
included, from every other process on the machine — other tests' under ``pytest -n`` among them.
"""

from __future__ import annotations

from pathlib import Path


def processes_marked(mark: str) -> list[int]:
    """The ids of running processes whose environment holds ``mark`` (``NAME=value``)."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if mark.encode() in environ.read_bytes():
                found.append(int(environ.parent.name))
        except OSError:  # gone, or not ours to read
            continue
    return found
