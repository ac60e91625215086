"""Paused queues: ``flow.sql``."""

from __future__ import annotations

from django_pgqueue.conf import conf
from django_pgqueue.store.reports import PausedQueue
from django_pgqueue.store.statements.base import StoreBase


class FlowStatements(StoreBase):
    """Paused queues statements of :class:`~django_pgqueue.store.queue.QueueStore`."""

    # sql/flow.sql: pause and resume; claim_batch (sql/lease.sql) skips paused queues.
    def pause_queue(self, queue: str, *, paused_by: str, reason: str) -> PausedQueue:
        """Pause ``queue`` (from the next claim round on); return its pause.

        A queue already paused keeps its first pause, returned with ``created`` False.
        Runs in the connection's current transaction: the pause holds once it commits.
        """
        rows = self._run("pause_queue", queue=queue, paused_by=paused_by, reason=reason).dicts()
        if not rows:  # a concurrent pause committed after this statement's snapshot
            return self.pause_queue(queue, paused_by=paused_by, reason=reason)
        return PausedQueue(**rows[0])

    def resume_queue(self, queue: str) -> PausedQueue | None:
        """Resume ``queue`` and wake its workers; return the pause removed (None: none)."""
        rows = self._run("resume_queue", queue=queue, channel=conf.NOTIFY_CHANNEL).rows
        if not rows:
            return None
        name, paused_at, paused_by, reason, _notified = rows[0]
        return PausedQueue(name, paused_at, paused_by, reason, created=False)

    def paused_queues(self) -> dict[str, PausedQueue]:
        """Return every paused queue, by name."""
        return {
            row["queue"]: PausedQueue(**row, created=False)
            for row in self._run("paused_queues").dicts()
        }
