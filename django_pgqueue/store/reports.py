"""What the admin, the metrics and the probes read: typed rows of read-only statements."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING

from django_pgqueue.states import JobStatus

if TYPE_CHECKING:
    pass

__all__ = [
    "DeadLetterGroup",
    "InvalidIndex",
    "LiveWorker",
    "PartitionBlocker",
    "PausedQueue",
    "QueueCounts",
    "QueueLag",
    "QueueMinute",
    "QueueTotals",
    "QueueWorkers",
    "SnapshotHolder",
    "StuckKind",
    "StuckWork",
    "TableHealth",
    "WorkerHeartbeat",
    "WorkerLoad",
]


@dataclass(frozen=True, slots=True)
class LiveWorker:
    """A registry row that counts for bucket ownership."""

    worker_id: str
    queues: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class QueueCounts:
    """Finished-job counts of one queue since the last flush."""

    queue: str
    succeeded: int = 0
    failed: int = 0
    dead_lettered: int = 0
    wait_ms_max: int = 0


@dataclass(frozen=True, slots=True)
class QueueLag:
    """One queue"s backlog and health, as the admin"s lag page shows it."""

    queue: str
    ready: int
    scheduled: int
    processing: int
    expired: int
    dead_letters: int
    #: Pending jobs waiting for a worker that can import their task (a rolling deploy).
    unknown_task: int
    #: Jobs waiting for the jobs they run after (after=); not part of the lag.
    blocked: int
    #: When the oldest ready job became ready (None: nothing is ready).
    oldest_ready_at: datetime | None
    measured_at: datetime
    #: ready, scheduled and dead_letters stop counting here (the true number may be larger).
    count_limit: int

    @property
    def lag_seconds(self) -> float:
        """Return how long the oldest ready job has been waiting (0 when none is ready)."""
        if self.oldest_ready_at is None:
            return 0.0
        return max((self.measured_at - self.oldest_ready_at).total_seconds(), 0.0)


@dataclass(frozen=True, slots=True)
class QueueMinute:
    """One minute of one queue"s counters, as workers record them."""

    queue: str
    minute: datetime
    succeeded: int
    failed: int
    dead_lettered: int
    wait_ms_max: int

    @property
    def finished(self) -> int:
        """Return the jobs that finished an attempt in this minute, whatever the outcome."""
        return self.succeeded + self.failed + self.dead_lettered


@dataclass(frozen=True, slots=True)
class TableHealth:
    """Size and vacuum state of the job table, from PostgreSQL"s statistics views."""

    total_bytes: int
    table_bytes: int
    index_bytes: int
    live_tuples: int
    dead_tuples: int
    modified_since_analyze: int
    last_vacuum: datetime | None
    last_autovacuum: datetime | None
    last_analyze: datetime | None
    last_autoanalyze: datetime | None
    autovacuum_count: int
    autoanalyze_count: int

    @property
    def dead_fraction(self) -> float:
        """Return the share of dead tuples among all tuples (0 for an empty table)."""
        total = self.live_tuples + self.dead_tuples
        return self.dead_tuples / total if total else 0.0


@dataclass(frozen=True, slots=True)
class SnapshotHolder:
    """What holds VACUUM back the longest (``vacuum_horizon``): while it stays, no dead
    tuple of the job table newer than its snapshot can be removed."""

    #: "session", "prepared transaction" or "replication slot".
    kind: str
    #: The session's (or the slot's active walsender's) process id.
    pid: int | None
    role: str | None
    #: The session's application_name, the prepared transaction's gid or the slot's name.
    name: str | None
    client: str | None
    #: pg_stat_activity's state ("idle in transaction", "active", ...).
    state: str | None
    #: Since its transaction began (None for a slot, or a standby's feedback).
    age_seconds: float | None
    #: Transactions begun since its snapshot: how far behind the horizon is.
    xid_age: int
    #: The start of its current or last statement.
    query: str | None


@dataclass(frozen=True, slots=True)
class QueueTotals:
    """One queue"s finished attempts over a recent window, from the per-minute counters."""

    queue: str
    succeeded: int
    failed: int
    dead_lettered: int
    #: Longest time a job claimed in the window had been ready, in milliseconds.
    wait_ms_max: int


@dataclass(frozen=True, slots=True)
class QueueWorkers:
    """How many registered workers serve one queue, by liveness."""

    queue: str
    live: int
    draining: int
    #: Alive or draining but not heard from within the worker timeout.
    silent: int


@dataclass(frozen=True, slots=True)
class WorkerHeartbeat:
    """A registry row that is not dead, and how long it has been silent."""

    worker_id: str
    pid: int
    status: str
    #: Seconds since its last heartbeat, on the database"s clock.
    silent_seconds: float


@dataclass(frozen=True, slots=True)
class DeadLetterGroup:
    """Dead letters of one task that failed with one error class."""

    task_path: str
    last_error_class: str | None
    jobs: int
    sample_job_id: int
    sample_queue: str
    sample_error: str | None
    sample_finished_at: datetime | None


@dataclass(frozen=True, slots=True)
class PausedQueue:
    """A paused queue: who paused it, when (database clock) and why."""

    queue: str
    paused_at: datetime
    paused_by: str
    reason: str
    #: False when the queue was already paused (this pause is the earlier one).
    created: bool = True


@dataclass(frozen=True, slots=True)
class PartitionBlocker:
    """The job a partitioned job waits for."""

    job_id: int
    status: JobStatus


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    """The running jobs a worker holds leases on."""

    worker_id: str
    jobs: int
    expired: int


class StuckKind(StrEnum):
    """What is stuck: the four things an incident asks about first."""

    #: Running jobs whose lease ran out: their worker died or hangs (subject: the queue).
    EXPIRED_LEASE = "expired_lease"
    #: A worker alive or draining that stopped heartbeating (subject: the worker id).
    STALLED_WORKER = "stalled_worker"
    #: A queue with ready jobs that no live worker serves (subject: the queue).
    UNSERVED_QUEUE = "unserved_queue"
    #: A concurrency key at its in-flight limit with ready jobs waiting (subject: the key).
    FULL_KEY = "full_key"


@dataclass(frozen=True, slots=True)
class StuckWork:
    """One stuck thing, as the lag page and the inbox list them."""

    kind: StuckKind
    subject: str
    #: The queue (of the key"s next job, for a key; None for a worker).
    queue: str | None
    #: Jobs concerned: expired, held by the worker, ready in the queue, waiting on the key
    #: (stops at the query"s count limit).
    jobs: int
    #: Since when: the first lease that ran out, the worker"s last heartbeat, the oldest
    #: ready job"s availability (queue or key).
    since: datetime | None
    #: The key"s limit (full keys only).
    max_in_flight: int | None = None


@dataclass(frozen=True, slots=True)
class InvalidIndex:
    """An index PostgreSQL keeps up to date on every write but no query may use."""

    schema_name: str
    table_name: str
    index_name: str
    #: ``CREATE INDEX`` statement of the index, as ``pg_get_indexdef`` prints it.
    definition: str
    #: Pid of a concurrent index build under way on the table, which may be this one"s.
    building_pid: int | None
