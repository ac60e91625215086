"""Housekeeping.

``maintenance.sql``: the reaper, pruning, partition repair, the worker registry and queue
statistics, and the settings row the SQL enqueue function reads.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from django_pgqueue.conf import conf
from django_pgqueue.limits import Rate
from django_pgqueue.states import JobStatus
from django_pgqueue.store.notices import flow_channel, lease_channel
from django_pgqueue.store.reports import LiveWorker, QueueCounts
from django_pgqueue.store.retry import RetryPolicy
from django_pgqueue.store.runners import load_json
from django_pgqueue.store.statements.base import (
    HOUSEKEEPING_LOCK_KEY,
    StoreBase,
    timeout_setting,
)
from django_pgqueue.store.values import ReapedJob


class MaintenanceStatements(StoreBase):
    """Housekeeping statements of :class:`~django_pgqueue.store.queue.QueueStore`."""

    def try_housekeeping_lock(self, *, idle_timeout: float | None = None) -> bool:
        """Take the transaction-level housekeeping lock if free; call inside a transaction.

        ``idle_timeout`` (seconds; None: unbounded) is how long the rest of the
        transaction may sit idle before the server ends the session, so a paused
        process cannot keep the lock from the other workers.
        """
        rows = self._run(
            "try_housekeeping_lock",
            lock_key=HOUSEKEEPING_LOCK_KEY,
            idle_timeout=timeout_setting(idle_timeout),
        ).rows
        return bool(rows[0][0])

    def reap_expired(
        self,
        *,
        limit: int = 1000,
        policy: RetryPolicy | None = None,
        job_ids: Sequence[int] | None = None,
        expired_since: datetime | None = None,
    ) -> list[ReapedJob]:
        """Recover up to ``limit`` jobs whose lease expired (optionally only ``job_ids``).

        Each goes back to pending after a backoff, or to dead_letter if that was its last
        attempt. Rows locked by someone else (a late completion in progress) are skipped.
        ``expired_since`` leaves out leases that expired before it.
        """
        policy = policy or RetryPolicy.from_settings()
        rows = self._run(
            "reap_expired",
            limit=limit,
            job_ids=list(job_ids) if job_ids is not None else None,
            expired_since=expired_since,
            lease_channel=lease_channel(),
            **policy.sql_params(),
        ).rows
        return [ReapedJob(job_id, JobStatus(status), queue) for job_id, status, queue in rows]

    def transaction_clock(self) -> datetime:
        """Return the database clock at the start of this transaction (``now()``)."""
        now: datetime = self._run("transaction_clock").rows[0][0]
        return now

    def expired_job_ids(self, *, limit: int) -> list[int]:
        """Return up to ``limit`` ids of jobs whose lease expired, longest expired first."""
        return [row[0] for row in self._run("expired_job_ids", limit=limit).rows]

    def prune_finished(self, *, retention_seconds: float, limit: int) -> int:
        """Delete up to ``limit`` succeeded/cancelled jobs older than the retention."""
        return self._run(
            "prune_finished", retention_seconds=retention_seconds, limit=limit
        ).rowcount

    def prune_dead_letters(self, *, retention_seconds: float, limit: int) -> int:
        """Delete up to ``limit`` dead letters older than the retention."""
        return self._run(
            "prune_dead_letters", retention_seconds=retention_seconds, limit=limit
        ).rowcount

    def partitions_out_of_date(
        self, *, after_key: str = "", scan_limit: int = 10_000
    ) -> tuple[list[str], str | None]:
        """Return the partitions whose claim state disagrees with the job table.

        Scans at most ``scan_limit`` partitions with pending jobs after ``after_key``;
        also returns where to resume (None: the scan reached the end).
        """
        rows = self._run("partitions_out_of_date", after_key=after_key, scan_limit=scan_limit).rows
        keys = [key for key, kind in rows if kind != "scanned"]
        resume = next(key for key, kind in rows if kind == "scanned")
        return keys, resume

    def prune_idle_concurrency_keys(self, *, limit: int = 1000) -> int:
        """Forget rate-limited keys without jobs whose bucket is full again; return how many."""
        return len(self._run("prune_idle_concurrency_keys", limit=limit).rows)

    def prune_coalesce_keys(self, *, limit: int, recheck_seconds: float) -> int:
        """Forget up to ``limit`` coalesce keys whose job no longer holds them.

        Two statements in one transaction (the caller's, or a savepoint of it): the rows
        are locked first, then checked in a snapshot taken after the lock. Returns how
        many rows were deleted.
        """
        with self.runner.atomic():
            rows = self._run(
                "lock_coalesce_keys", limit=limit, recheck_seconds=recheck_seconds
            ).rows
            if not rows:
                return 0
            keys = [row[0] for row in rows]
            return int(self._run("free_coalesce_keys", keys=keys).rows[0][0])

    def repair_partitions(self, partition_keys: Sequence[str]) -> int:
        """Recompute the claim state of ``partition_keys`` from the job table."""
        if not partition_keys:
            return 0
        rows = self._run("repair_partitions", partition_keys=list(partition_keys)).rows
        return int(rows[0][0] or 0)

    def missing_tables(self, tables: Sequence[str]) -> list[str]:
        """Return those of ``tables`` that do not exist (``migrate`` was not run)."""
        return [row[0] for row in self._run("missing_tables", tables=list(tables)).rows]

    def register_worker(
        self,
        worker_id: str,
        *,
        hostname: str,
        pid: int,
        queues: Sequence[str],
        concurrency: int,
        metadata: Mapping[str, Any],
        timeout_seconds: float,
    ) -> bool:
        """Add the worker to the registry (alive); return False if a live worker has the id.

        A row left by a dead worker, or one silent for longer than ``timeout_seconds``,
        is taken over.
        """
        rows = self._run(
            "register_worker",
            worker_id=worker_id,
            hostname=hostname,
            pid=pid,
            queues=json.dumps(list(queues)),
            concurrency=concurrency,
            metadata=json.dumps(dict(metadata)),
            timeout_seconds=timeout_seconds,
        ).rows
        return bool(rows)

    def heartbeat_worker(
        self,
        worker_id: str,
        *,
        status: str,
        hostname: str,
        pid: int,
        queues: Sequence[str],
        concurrency: int,
        metadata: Mapping[str, Any],
    ) -> datetime:
        """Refresh the worker's registry row (re-creating it if needed)."""
        rows = self._run(
            "heartbeat_worker",
            worker_id=worker_id,
            status=status,
            hostname=hostname,
            pid=pid,
            queues=json.dumps(list(queues)),
            concurrency=concurrency,
            metadata=json.dumps(dict(metadata)),
        ).rows
        seen_at: datetime = rows[0][0]
        return seen_at

    def set_worker_status(self, worker_id: str, status: str) -> bool:
        """Set the worker's registry status; return whether its row exists."""
        return bool(self._run("set_worker_status", worker_id=worker_id, status=status).rows)

    def live_workers(self, *, timeout_seconds: float) -> list[LiveWorker]:
        """Return alive workers heard from within the timeout, sorted by id."""
        rows = self._run("live_workers", timeout_seconds=timeout_seconds).rows
        return [LiveWorker(worker_id, tuple(load_json(queues))) for worker_id, queues in rows]

    def mark_silent_workers_dead(self, *, timeout_seconds: float) -> list[str]:
        """Mark workers silent for longer than the timeout dead; return their ids."""
        rows = self._run("mark_silent_workers_dead", timeout_seconds=timeout_seconds).rows
        return [row[0] for row in rows]

    def prune_dead_workers(self, *, retention_seconds: float) -> int:
        """Delete dead workers' rows older than the retention."""
        return self._run("prune_dead_workers", retention_seconds=retention_seconds).rowcount

    def record_queue_stats(self, counts: Sequence[QueueCounts]) -> None:
        """Add finished-job counts to the current minute of each queue."""
        if not counts:
            return
        self._run(
            "record_queue_stats",
            queues=[count.queue for count in counts],
            succeeded=[count.succeeded for count in counts],
            failed=[count.failed for count in counts],
            dead_lettered=[count.dead_lettered for count in counts],
            wait_ms_max=[count.wait_ms_max for count in counts],
        )

    def prune_queue_stats(self, *, retention_seconds: float) -> int:
        """Delete per-minute statistics older than the retention."""
        return self._run("prune_queue_stats", retention_seconds=retention_seconds).rowcount

    def sync_sql_settings(
        self,
        *,
        queues: Sequence[str] | None,
        concurrency_limits: dict[str, int],
        rate_limits: dict[str, Rate],
        synced_by: str,
    ) -> None:
        """Write the settings ``django_pgqueue_enqueue()`` applies (None: any queue)."""
        self._run(
            "sync_sql_settings",
            queues=None if queues is None else json.dumps(sorted(queues)),
            max_attempts=conf.MAX_ATTEMPTS,
            max_payload_bytes=conf.MAX_PAYLOAD_BYTES,
            notify_channel=conf.NOTIFY_CHANNEL,
            flow_channel=flow_channel(),
            concurrency_limits=json.dumps(concurrency_limits),
            rate_limits=json.dumps(
                {name: [rate.limit, rate.period] for name, rate in rate_limits.items()}
            ),
            synced_by=synced_by,
        )
