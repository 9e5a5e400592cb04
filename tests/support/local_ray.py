"""A local Ray cluster for one test, started so that it cannot join another test's."""

from __future__ import annotations

from typing import Any


def start_local_ray(**settings: Any) -> Any:
    """``ray.init(address="local", ...)`` (never another test's cluster), tried three times: under the full
    suite a starting head has failed to reach its own GCS ("Failed to start GCS") while verl runs in the
    other worker start theirs; a second start gets fresh ports and a fresh session."""
    import ray

    for attempt in range(3):
        try:
            return ray.init(address="local", include_dashboard=False, log_to_driver=False, **settings)
        except (RuntimeError, ConnectionError):
            ray.shutdown()
            if attempt == 2:
                raise
    return None
