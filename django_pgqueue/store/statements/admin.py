"""The admin's reads: ``admin.sql`` (lag, dead-letter groups, partitions, stuck work). Read-only."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from django_pgqueue.states import JobStatus
from django_pgqueue.store.reports import (
    DeadLetterGroup,
    PartitionBlocker,
    QueueLag,
    QueueMinute,
    SnapshotHolder,
    StuckKind,
    StuckWork,
    TableHealth,
    WorkerLoad,
)
from django_pgqueue.store.statements.base import StoreBase


class AdminStatements(StoreBase):
    """The admin's reads statements of :class:`~django_pgqueue.store.queue.QueueStore`."""

    # The admin pages' queries (sql/admin.sql). None writes or locks; each uses an index.
    def estimated_job_count(self) -> int | None:
        """Return the planner's estimate of the job table's rows; None if never analyzed."""
        rows = self._run("estimated_job_count").rows
        return None if not rows or rows[0][0] is None else int(rows[0][0])

    def job_table_health(self) -> TableHealth | None:
        """Return the job table's size and vacuum statistics (None if it is not visible)."""
        rows = self._run("job_table_health").dicts()
        return TableHealth(**rows[0]) if rows else None

    def vacuum_horizon(self) -> SnapshotHolder | None:
        """Return what holds VACUUM back the longest (None: nothing visible holds it)."""
        rows = self._run("vacuum_horizon").dicts()
        return SnapshotHolder(**rows[0]) if rows else None

    def known_queues(self, configured: Iterable[str] = ()) -> list[str]:
        """Return the queues worth showing, sorted: ``configured`` and every queue in use."""
        rows = self._run("known_queues", configured=sorted(set(configured))).rows
        return [row[0] for row in rows]

    def queue_lag(self, queues: Sequence[str], *, count_limit: int = 10_000) -> list[QueueLag]:
        """Return the backlog of each queue, sorted by name; counts stop at ``count_limit``."""
        rows = self._run("queue_lag", queues=list(queues), count_limit=count_limit).dicts()
        return [QueueLag(**row, count_limit=count_limit) for row in rows]

    def queue_minutes(self, queues: Sequence[str], *, minutes: int = 60) -> list[QueueMinute]:
        """Return the per-minute counters of ``queues`` over the last ``minutes``, oldest first."""
        rows = self._run("queue_minutes", queues=list(queues), minutes=minutes).dicts()
        return [QueueMinute(**row) for row in rows]

    def dead_letter_groups(self, *, limit: int = 500) -> list[DeadLetterGroup]:
        """Return dead letters grouped by task and error class, the largest groups first."""
        rows = self._run("dead_letter_groups", limit=limit).dicts()
        return [DeadLetterGroup(**row) for row in rows]

    def partition_blocker(self, job_id: int, partition_key: str) -> PartitionBlocker | None:
        """Return the job a pending partitioned job waits for; None if it is the head."""
        rows = self._run("partition_blocker", job_id=job_id, partition_key=partition_key).rows
        return PartitionBlocker(rows[0][0], JobStatus(rows[0][1])) if rows else None

    def partition_waiting(
        self, job_id: int, partition_key: str, *, include_older: bool, limit: int
    ) -> list[int]:
        """Return up to ``limit`` ids of the partition's pending jobs queued behind a job.

        ``include_older`` counts every other pending job (the job is running); otherwise
        only younger ones (the job is pending: older ones run before it).
        """
        rows = self._run(
            "partition_waiting",
            job_id=job_id,
            partition_key=partition_key,
            include_older=include_older,
            limit=limit,
        ).rows
        return [row[0] for row in rows]

    def jobs_in_flight(self, worker_ids: Sequence[str]) -> dict[str, WorkerLoad]:
        """Return the running jobs of each of ``worker_ids`` that holds any, by worker id."""
        if not worker_ids:
            return {}
        rows = self._run("jobs_in_flight", worker_ids=list(worker_ids)).dicts()
        return {row["worker_id"]: WorkerLoad(**row) for row in rows}

    def stuck_work(
        self,
        queues: Sequence[str],
        *,
        timeout_seconds: float,
        count_limit: int = 10_000,
        row_limit: int = 20,
    ) -> list[StuckWork]:
        """Return what is stuck: expired leases, silent workers, unserved queues, full keys.

        ``queues`` are the queues to look at for a live worker; a worker counts as live
        while it heartbeated within ``timeout_seconds``. At most ``row_limit`` of each
        kind, the longest stuck first; job counts stop at ``count_limit``.
        """
        rows = self._run(
            "stuck_work",
            queues=list(queues),
            timeout_seconds=timeout_seconds,
            count_limit=count_limit,
            row_limit=row_limit,
        ).dicts()
        return [StuckWork(**{**row, "kind": StuckKind(row["kind"])}) for row in rows]
