"""The health probes' reads: ``health.sql``. Read-only."""

from __future__ import annotations

from django_pgqueue.store.reports import WorkerHeartbeat
from django_pgqueue.store.statements.base import StoreBase


class HealthStatements(StoreBase):
    """The health probes' reads statements of :class:`~django_pgqueue.store.queue.QueueStore`."""

    # sql/health.sql: manage.py queuehealth.
    def worker_heartbeats(
        self, *, hostname: str | None = None, worker_id: str | None = None
    ) -> list[WorkerHeartbeat]:
        """Return the registry rows that are not dead of ``hostname`` or ``worker_id``."""
        rows = self._run("worker_heartbeats", hostname=hostname, worker_id=worker_id).dicts()
        return [WorkerHeartbeat(**row) for row in rows]
