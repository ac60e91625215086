"""Which queues the admin lists: the configured ones and every queue in use."""

from __future__ import annotations

from ..compat import task_backends
from ..models import Job

__all__ = ["configured_queues", "known_queues"]


def configured_queues() -> set[str]:
    """Return the queues named in ``TASKS`` by the backends of this package."""
    from ..backend import PgQueueBackend

    queues: set[str] = set()
    for alias in task_backends.settings:
        backend = task_backends[alias]
        if isinstance(backend, PgQueueBackend):
            queues.update(backend.queues)
    return queues


def known_queues(using: str | None = None) -> list[str]:
    """Return every queue worth showing, sorted: configured, holding jobs, or served."""
    return Job.objects.store(using).known_queues(configured_queues())
