"""The history tier's upkeep.

``history.sql``: retention classes written from the settings, partitions made ahead,
and pruning by dropping whole partitions.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from django_pgqueue.store.retention import HistoryPartition, HistoryPrune, RetentionClass
from django_pgqueue.store.statements.base import StoreBase


class HistoryStatements(StoreBase):
    """History statements of :class:`~django_pgqueue.store.queue.QueueStore`."""

    def limit_lock_wait(self, *, timeout_seconds: float) -> None:
        """Bound every lock wait of the rest of this transaction (SET LOCAL lock_timeout)."""
        self._run(
            "limit_history_lock_wait", lock_timeout=f"{max(1, round(timeout_seconds * 1000))}ms"
        )

    def sync_history_classes(self, classes: Sequence[RetentionClass]) -> tuple[int, int]:
        """Write the retention classes; return (rows written, queue classes retired)."""
        document = json.dumps(
            [[cls.status, cls.queue, cls.keep_seconds] for cls in classes], separators=(",", ":")
        )
        written, retired = self._run("sync_history_classes", classes=document).rows[0]
        return int(written), int(retired)

    def ensure_history_partitions(self, *, period: str, ahead: int) -> tuple[int, int]:
        """Make the missing partitions up to ``ahead`` periods on; return (made, skipped)."""
        created, skipped = self._run("ensure_history_partitions", period=period, ahead=ahead).rows[
            0
        ]
        return int(created), int(skipped)

    def prune_history(self, *, max_drops: int, default_limit: int) -> HistoryPrune:
        """Drop expired partitions (and expired rows of the DEFAULT partitions)."""
        dropped, rows, deferred, deleted = self._run(
            "prune_history", max_drops=max_drops, default_limit=default_limit
        ).rows[0]
        return HistoryPrune(
            dropped=int(dropped),
            rows_estimate=int(rows),
            deferred=int(deferred),
            deleted=int(deleted),
        )

    def history_partitions(self) -> list[HistoryPartition]:
        """Every partition of the history, by class, oldest first (the catalog only)."""
        return [HistoryPartition(*row) for row in self._run("history_partitions").rows]

    def move_finished(self, *, limit: int) -> int:
        """Move up to ``limit`` finished jobs left in the job table to the history."""
        return int(self._run("move_finished", limit=limit).rows[0][0])

    def prune_idempotency_keys(self, *, limit: int, recheck_seconds: float) -> int:
        """Free up to ``limit`` idempotency keys no job holds any more; return how many.

        Two statements in one transaction (the caller's, or a savepoint of it): the
        keys are locked first, then checked in a snapshot taken after the lock.
        """
        with self.runner.atomic():
            rows = self._run(
                "lock_idempotency_keys", limit=limit, recheck_seconds=recheck_seconds
            ).rows
            if not rows:
                return 0
            keys = [row[0] for row in rows]
            return int(self._run("free_idempotency_keys", keys=keys).rows[0][0])
