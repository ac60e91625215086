"""Typed values the queue store takes and returns.

What a producer asks for (:class:`JobSpec`), what it gets back (:class:`Enqueued`,
:class:`JobSnapshot`), what a worker holds (:class:`Lease`, :class:`ClaimedJob`) and
reports (:class:`Failure`), and the schedules it fires. Nothing here
runs a query: the store (:mod:`django_pgqueue.store.queue`) builds these from its rows.
The read-only rows of the admin, metrics and probes are in :mod:`django_pgqueue.store.reports`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.db import models

from django_pgqueue.states import BlockerFailure, JobStatus
from django_pgqueue.store.flow_limits import Rate

if TYPE_CHECKING:
    from django_pgqueue.models import Job

__all__ = [
    "ClaimFloor",
    "ClaimRound",
    "ClaimedJob",
    "DueSchedule",
    "Enqueued",
    "FailOutcome",
    "Failure",
    "FireResult",
    "JobSnapshot",
    "JobSpec",
    "Lease",
    "LeaseExtension",
    "OperatorResult",
    "PausedSchedule",
    "ReapedJob",
    "ScheduleDefinition",
    "Snoozed",
]


@dataclass(frozen=True, slots=True)
class JobSpec:
    """Everything needed to enqueue one job."""

    task_path: str
    queue: str = "default"
    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    priority: int = 0
    max_attempts: int | None = None
    available_at: datetime | None = None
    idempotency_key: str | None = None
    partition_key: str | None = None
    #: Jobs sharing a concurrency key run at most ``concurrency_limit`` at a time, in any
    #: order (a key without a limit is an error; see :mod:`django_pgqueue.store.flow_limits`).
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    #: At most N starts per period for the job's key: ``"20/s"``, ``"1000/h"``, a Rate.
    rate_limit: str | Rate | None = None
    #: W3C traceparent of the span that enqueued the job (None: the current span's, if
    #: OpenTelemetry is installed and a span is active).
    traceparent: str | None = None
    #: While a job with this key is pending, enqueueing returns it (with these
    #: arguments) instead of inserting another; see sql/enqueue.sql, enqueue_coalesced.
    coalesce_key: str | None = None
    #: With a coalesce key: start the job no sooner than this after the latest enqueue.
    debounce: timedelta | float | None = None
    #: Ids of the jobs this one runs after (it is stored ``blocked`` until they succeed).
    after: Sequence[Any] = ()
    #: What it does if one of them ends dead-lettered or cancelled (see
    #: :class:`~django_pgqueue.states.BlockerFailure`).
    on_blocker_failure: str = BlockerFailure.CANCEL


@dataclass(frozen=True, slots=True)
class JobSnapshot:
    """A job row as a plain value (the same fields as :class:`~django_pgqueue.models.Job`)."""

    id: int
    queue: str
    task_path: str
    args: list[Any]
    kwargs: dict[str, Any]
    priority: int
    status: str
    attempts: int
    max_attempts: int
    lease_generation: int
    claimed_by: str | None
    claimed_at: datetime | None
    lease_expires_at: datetime | None
    available_at: datetime
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    last_error: str | None
    last_error_class: str | None
    errors: list[dict[str, Any]]
    result: Any
    idempotency_key: str | None
    partition_key: str | None
    partition_bucket: int | None
    step: str | None
    unknown_task_since: datetime | None
    traceparent: str | None
    coalesce_key: str | None = None
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    rate_limit: int | None = None
    rate_period: float | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> JobSnapshot:
        """Build a snapshot from a decoded ``SELECT *``/``RETURNING *`` row."""
        return cls(**{name: row[name] for name in _SNAPSHOT_FIELDS})

    def to_job(self, alias: str) -> Job:
        """Return the job as a model instance, as if loaded from ``alias``.

        The fields the snapshot lacks (``has_dependents``, ``awaited``) are deferred.
        """
        # Through the app registry: the store sits beneath the models and imports none.
        job_model = apps.get_model("django_pgqueue", "Job")
        # Model.from_db takes a partial row's values in the model's field order, not in
        # the order of the names it is given.
        names = _fields_in_model_order(job_model)
        job: Job = job_model.from_db(alias, names, [getattr(self, name) for name in names])
        return job


_SNAPSHOT_FIELDS: tuple[str, ...] = tuple(JobSnapshot.__dataclass_fields__)


@functools.cache
def _fields_in_model_order(model: type[models.Model]) -> tuple[str, ...]:
    return tuple(
        field.attname for field in model._meta.concrete_fields if field.attname in _SNAPSHOT_FIELDS
    )


class Enqueued:
    """The outcome of enqueueing one job.

    A bulk insert knows everything about its new rows without reading them back, so the
    snapshot (and the model instance) are only built when asked for.
    """

    __slots__ = ("_id", "_pending", "_snapshot", "alias", "created")

    def __init__(
        self,
        snapshot: JobSnapshot | None,
        created: bool,
        alias: str,
        *,
        pending: tuple[int, datetime, datetime, Mapping[str, Any]] | None = None,
    ) -> None:
        #: False when an existing job already held the idempotency key or the (pending)
        #: coalesce key, and was returned.
        self.created = created
        #: The database alias the job was written to.
        self.alias = alias
        self._snapshot = snapshot
        self._pending = pending
        if snapshot is not None:
            self._id = snapshot.id
        else:
            assert pending is not None
            self._id = pending[0]

    def __repr__(self) -> str:
        return f"<Enqueued job {self._id} created={self.created}>"

    @property
    def id(self) -> int:
        """Return the job's id."""
        return self._id

    @property
    def inserted(self) -> tuple[datetime, datetime] | None:
        """Return ``(created_at, available_at)`` of a job this call inserted, else None."""
        if self._pending is None:
            return None
        return self._pending[1], self._pending[2]

    def inserted_pending(self) -> tuple[int, datetime, str, str] | None:
        """Return ``(id, created_at, args JSON, kwargs JSON)`` of a job this call inserted
        ready to run (pending), else None.

        What a bulk enqueue's caller needs to describe each new job, in one call.
        """
        pending = self._pending
        if pending is None or not self.created:
            return None
        params = pending[3]
        if params.get("status", JobStatus.PENDING) != JobStatus.PENDING:
            return None
        return pending[0], pending[1], params["args"], params["kwargs"]

    @property
    def snapshot(self) -> JobSnapshot:
        """Return the job as a plain value (built on first access for bulk inserts)."""
        if self._snapshot is None:
            assert self._pending is not None
            self._snapshot = _new_snapshot(*self._pending)
            self._pending = None
        return self._snapshot

    @property
    def job(self) -> Job:
        """Return the job as a model instance (built on each access)."""
        return self.snapshot.to_job(self.alias)


@dataclass(frozen=True, slots=True)
class Lease:
    """The identity of one lease: a worker's right to finish one attempt of one job."""

    job_id: int
    lease_generation: int
    worker_id: str


@dataclass(slots=True)
class ClaimedJob:
    """A job leased to a worker, with what the worker needs to run it."""

    id: int
    queue: str
    task_path: str
    args: list[Any]
    kwargs: dict[str, Any]
    priority: int
    attempts: int
    max_attempts: int
    lease_generation: int
    step: str | None
    partition_key: str | None
    idempotency_key: str | None
    created_at: datetime
    available_at: datetime
    claimed_at: datetime
    lease_expires_at: datetime
    prior_workers: list[str]
    worker_id: str
    #: When a worker first found this job's task unknown (None: no worker has yet).
    unknown_task_since: datetime | None = None
    #: W3C traceparent of the span that enqueued it (None: none was active, or no tracing).
    traceparent: str | None = None
    #: The job's concurrency key (None: no concurrency limit).
    concurrency_key: str | None = None

    @property
    def lease(self) -> Lease:
        """Return the lease this claim holds."""
        return Lease(self.id, self.lease_generation, self.worker_id)


@dataclass(frozen=True, slots=True)
class ClaimFloor:
    """Where a claim of one queue starts: after this job, in claim order.

    Claim order is priority (highest first), then ``available_at``, then id. A claim
    with a floor reads the queue's ready plain jobs after it, and jobs that sort before
    it are not seen: the worker that passes one claims from the head again soon after
    (:mod:`django_pgqueue.worker.cursor`).
    """

    priority: int
    available_at: datetime
    id: int

    @classmethod
    def after(cls, job: ClaimedJob) -> ClaimFloor:
        """Return the floor just past ``job``."""
        return cls(job.priority, job.available_at, job.id)

    def sort_key(self) -> tuple[int, datetime, int]:
        """Return a key that sorts floors in claim order."""
        return (-self.priority, self.available_at, self.id)


@dataclass(frozen=True, slots=True)
class ClaimRound:
    """What one claim returned: the jobs, and how many partitions it refreshed after."""

    jobs: list[ClaimedJob]
    #: Partitions and keys refreshed from urgent signals or woken in this round.
    folded: int = 0
    #: A partition or concurrency key of these queues may still have a job that could
    #: start: claim the next round with ``plain=False``.
    flow_open: bool = True
    #: More urgent signals were waiting than one fold takes: claim again soon.
    more_signals: bool = False

    @property
    def keys_open(self) -> bool:
        """Return :attr:`flow_open` (its name before partitions shared it)."""
        return self.flow_open


@dataclass(frozen=True, slots=True)
class LeaseExtension:
    """What one batched lease extension found."""

    #: (job id, lease generation) of the leases extended.
    held: frozenset[tuple[int, int]]
    #: Still this worker's, but the row was locked (an atomic task's open transaction):
    #: not extended this time, not lost.
    busy: frozenset[tuple[int, int]]
    #: Of those held or busy, the ones an operator asked to cancel: stop their handlers.
    cancelling: frozenset[tuple[int, int]] = frozenset()

    @property
    def held_ids(self) -> frozenset[int]:
        """Return the ids of the jobs whose lease was extended."""
        return frozenset(job_id for job_id, _ in self.held)

    def lost(self, leases: Iterable[Lease]) -> list[Lease]:
        """Return those of ``leases`` the extension found neither held nor busy."""
        kept = self.held | self.busy
        return [lease for lease in leases if (lease.job_id, lease.lease_generation) not in kept]


@dataclass(frozen=True, slots=True)
class Failure:
    """What went wrong in one attempt."""

    exception_class: str
    message: str
    traceback: str = ""
    #: Skip the remaining attempts and dead-letter the job. Separate from the class: a
    #: ``TypeError`` from arguments that do not bind is recorded as such, and permanent.
    permanent: bool = False


@dataclass(frozen=True, slots=True)
class FailOutcome:
    """Where a failed job went."""

    job_id: int
    status: JobStatus
    available_at: datetime
    attempts: int
    max_attempts: int


@dataclass(frozen=True, slots=True)
class Snoozed:
    """Where a snoozed job went: back to ``pending`` (or dead letter, or cancelled)."""

    job_id: int
    status: JobStatus
    available_at: datetime
    snoozes: int


@dataclass(frozen=True, slots=True)
class ReapedJob:
    """A job recovered from an expired lease."""

    job_id: int
    status: JobStatus
    queue: str


@dataclass(frozen=True, slots=True)
class OperatorResult:
    """What an operator action did and what it had to leave alone."""

    done: tuple[int, ...]
    skipped: tuple[int, ...]
    #: Of the skipped, those the action applied to but whose row stayed locked (a
    #: running job held by its atomic task's open transaction, say): try again later.
    busy: tuple[int, ...] = ()
    #: Of the done, those still running (a cancel): they end cancelled once their
    #: handler returns, keeping their slot, partition turn and lease until then.
    running: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class ScheduleDefinition:
    """A schedule's row as the code declares it (what ``upsert_schedule`` writes)."""

    name: str
    task_path: str
    queue: str
    priority: int
    max_attempts: int
    args: list[Any]
    kwargs: dict[str, Any]
    expression: str
    description: str
    timezone: str
    downtime: str
    catch_up: int
    timing: str
    #: The fired jobs' flow limits (see :func:`django_pgqueue.store.flow_limits.resolve_limits`).
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    rate_limit: int | None = None
    rate_period: float | None = None


@dataclass(frozen=True, slots=True)
class DueSchedule:
    """An active schedule's timing, read with the database clock."""

    name: str
    expression: str
    timezone: str
    downtime: str
    catch_up: int
    timing: str
    next_fire_at: datetime
    database_now: datetime

    @property
    def due(self) -> bool:
        """Return whether its next fire time has come."""
        return self.next_fire_at <= self.database_now


@dataclass(frozen=True, slots=True)
class PausedSchedule:
    """A paused schedule's timing, read with the database clock (to plan a resume)."""

    name: str
    expression: str
    timezone: str
    timing: str
    database_now: datetime


@dataclass(frozen=True, slots=True)
class FireResult:
    """What one ``fire_schedule`` did."""

    #: False when another worker (or an operator, or a sync) moved the schedule first.
    advanced: bool
    #: Jobs inserted (fire times that already had their job are not counted).
    inserted: int


# The admin's read-only figures.
def _new_snapshot(
    job_id: int, created_at: datetime, available_at: datetime, params: Mapping[str, Any]
) -> JobSnapshot:
    """Return the snapshot of a job just inserted from ``params`` (no round trip needed)."""
    return JobSnapshot(
        id=job_id,
        queue=params["queue"],
        task_path=params["task_path"],
        args=json.loads(params["args"]),
        kwargs=json.loads(params["kwargs"]),
        priority=params["priority"],
        status=params.get("status", JobStatus.PENDING),
        attempts=0,
        max_attempts=params["max_attempts"],
        lease_generation=0,
        claimed_by=None,
        claimed_at=None,
        lease_expires_at=None,
        available_at=available_at,
        created_at=created_at,
        started_at=None,
        finished_at=None,
        last_error=params.get("last_error"),
        last_error_class=None,
        errors=[],
        result=None,
        idempotency_key=params["idempotency_key"],
        partition_key=params["partition_key"],
        partition_bucket=params["partition_bucket"],
        concurrency_key=params["concurrency_key"],
        concurrency_limit=params["concurrency_limit"],
        rate_limit=params["rate_limit"],
        rate_period=params["rate_period"],
        step=None,
        unknown_task_since=None,
        traceparent=params["traceparent"],
    )
