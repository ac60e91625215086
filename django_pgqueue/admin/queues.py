"""Which queues the admin lists: the configured ones and every queue in use."""

from __future__ import annotations

from django_pgqueue.models import Job
from django_pgqueue.tasks.backend import configured_queues

__all__ = ["configured_queues", "known_queues"]


def known_queues(using: str | None = None) -> list[str]:
    """Return every queue worth showing, sorted: configured, holding jobs, or served."""
    return Job.objects.store(using).known_queues(configured_queues())
