"""One Tinker ``ServiceClient`` per run, closed when the run ends, however it ends.

The SDK keeps a background thread per client that sends session heartbeats. A client nobody closes
outlives the run: once its server is gone it prints "Your connection may be unreliable or Tinker is
down" into the user's terminal (after pytest's summary, in our own suite), and the session stays
open on a real Tinker service until it times out. Closing finishes the session with its status and
stops the thread, within a bound, so a server that has already died cannot hold the process.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Literal

CLOSE_TIMEOUT_S = 10.0
Status = Literal["success", "errored", "interrupted"]


def close_service(service: Any, status: Status = "success", timeout_s: float = CLOSE_TIMEOUT_S) -> None:
    """Finish the session (``status``) and stop the heartbeat thread; at most ``timeout_s`` seconds,
    and never an error of its own (the run's outcome is already decided)."""
    with contextlib.suppress(Exception):
        service.close(status).result(timeout=timeout_s)


@contextlib.contextmanager
def open_service(base_url: str | None, **kwargs: Any) -> Iterator[Any]:
    """A ``tinker.ServiceClient`` for the block, closed as ``success``, ``errored`` (an exception) or
    ``interrupted`` (Ctrl-C, a cancelled task) when the block ends."""
    import tinker

    service = tinker.ServiceClient(base_url=base_url, **kwargs)
    status: Status = "interrupted"
    try:
        yield service
        status = "success"
    except Exception:
        status = "errored"
        raise
    finally:
        close_service(service, status)
