"""The metrics' reads: ``metrics.sql``. Read-only."""

from __future__ import annotations

from collections.abc import Sequence

from django_pgqueue.store.reports import QueueTotals, QueueWorkers
from django_pgqueue.store.statements.base import StoreBase


class MetricsStatements(StoreBase):
    """The metrics' reads statements of :class:`~django_pgqueue.store.queue.QueueStore`."""

    # sql/metrics.sql: what django_pgqueue.metrics adds to the admin's queries.
    def queue_finished_totals(self, queues: Sequence[str], *, minutes: int) -> list[QueueTotals]:
        """Return each queue's finished attempts over the last ``minutes``, sorted by queue."""
        rows = self._run("queue_finished_totals", queues=list(queues), minutes=minutes).dicts()
        return [QueueTotals(**row) for row in rows]

    def queue_workers(self, queues: Sequence[str], *, timeout_seconds: float) -> list[QueueWorkers]:
        """Return how many live, draining and silent workers serve each queue."""
        rows = self._run(
            "queue_workers", queues=list(queues), timeout_seconds=timeout_seconds
        ).dicts()
        return [QueueWorkers(**row) for row in rows]
