"""The exceptions django-pgqueue raises, and the one tasks raise to give up at once.

Errors at the ``django.tasks`` boundary also subclass Django's own types, so code written
against the Tasks API (``except InvalidTask``) keeps working.
"""

from __future__ import annotations

import math
from datetime import timedelta

from django.core.exceptions import ImproperlyConfigured

from django_pgqueue.compat import InvalidTask, TaskResultDoesNotExist

__all__ = [
    "AppNotInstalled",
    "ConfigurationError",
    "DependencyInOtherDatabase",
    "EnqueueError",
    "InvalidArguments",
    "InvalidBatchResult",
    "InvalidIndexStatement",
    "InvalidOption",
    "InvalidSchedule",
    "JobCancelled",
    "JobNotFound",
    "JobTimeout",
    "LeaseExpired",
    "LeaseLost",
    "NotMigrated",
    "PayloadTooLarge",
    "PermanentError",
    "PgQueueError",
    "Snooze",
    "SnoozeLimitReached",
    "UnknownDependency",
    "UnknownQueue",
    "UnknownTask",
    "WorkerShutdown",
]


class PgQueueError(Exception):
    """Base class of django-pgqueue's errors. Never raised directly."""


class ConfigurationError(PgQueueError, ImproperlyConfigured):
    """A ``PGQUEUE_*`` setting or a ``TASKS`` entry is invalid."""


class AppNotInstalled(ConfigurationError):
    """A ``TASKS`` backend is a ``PgQueueBackend`` but ``django_pgqueue`` is not installed."""

    def __init__(self, alias: str) -> None:
        self.alias = alias
        super().__init__(
            f"TASKS[{alias!r}] uses PgQueueBackend but django_pgqueue is not in "
            "INSTALLED_APPS (django_pgqueue.E003): add it, then run manage.py migrate"
        )


class NotPostgreSQL(ConfigurationError):
    """The database that holds the jobs is not PostgreSQL (system check E001).

    ``setting`` names what to change: ``DATABASES[...]['ENGINE']``, or the backend's
    ``TASKS[...]['OPTIONS']['DATABASE']`` when that is what chose the database.
    """

    def __init__(self, database: str, vendor: str, setting: str, alias: str | None = None) -> None:
        self.database = database
        self.vendor = vendor
        self.setting = setting
        self.alias = alias
        fix = (
            f"point {setting} at a database whose ENGINE is 'django.db.backends.postgresql'"
            if setting.endswith("['DATABASE']")
            else f"set {setting} to 'django.db.backends.postgresql'"
        )
        where = f"TASKS[{alias!r}] stores its jobs in" if alias else "the job queue is in"
        super().__init__(
            f"{where} database {database!r}, which is {vendor}, not PostgreSQL "
            f"(django_pgqueue.E001): {fix}"
        )


class NotMigrated(ConfigurationError):
    """The queue's tables do not exist in the database: ``migrate`` was not run."""

    def __init__(self, database: str, tables: list[str] | None = None) -> None:
        self.database = database
        self.tables = tables or []
        missing = f" ({', '.join(self.tables)})" if self.tables else ""
        super().__init__(
            f"the job queue's tables are missing from database {database!r}{missing}: "
            "run manage.py migrate"
        )


class InvalidIndexStatement(PgQueueError, ValueError):
    """A migration's ``CREATE INDEX CONCURRENTLY`` statement does not build the index it names."""

    def __init__(self, index_name: str, statement: str) -> None:
        self.index_name = index_name
        self.statement = statement
        super().__init__(
            f"index {index_name!r}: the statement must start with "
            f'CREATE [UNIQUE] INDEX CONCURRENTLY "{index_name}" ON ..., not {statement[:80]!r}'
        )


class LeaseLost(PgQueueError):
    """The caller no longer holds the lease it names; nothing was changed.

    Another worker took the job over (the lease expired and was reaped), an operator
    acted on it, or it was already finished. The caller must stop counting on the job.
    """

    def __init__(self, job_id: int, lease_generation: int, worker_id: str) -> None:
        self.job_id = job_id
        self.lease_generation = lease_generation
        self.worker_id = worker_id
        super().__init__(
            f"job {job_id}: lease generation {lease_generation} of worker {worker_id!r} "
            "is no longer held"
        )


class JobNotFound(PgQueueError, TaskResultDoesNotExist):
    """No job has the given id."""

    def __init__(self, job_id: object) -> None:
        self.job_id = job_id
        super().__init__(f"no job with id {job_id!r}")


class UnknownTask(PgQueueError, InvalidTask):
    """A job's task path cannot be imported as a task by this process."""

    def __init__(self, task_path: str, reason: str) -> None:
        self.task_path = task_path
        self.reason = reason
        super().__init__(f"unknown task {task_path!r}: {reason}")


class JobTimeout(PgQueueError):
    """A job ran longer than its task's ``timeout``."""


class LeaseExpired(PgQueueError):
    """Recorded in a job's history when its lease ran out and housekeeping recovered it."""


class JobCancelled(PgQueueError):
    """Reported in a cancelled job's ``TaskResult.errors``."""


class WorkerShutdown(PgQueueError):
    """Recorded when a job is released because its worker shut down."""


class PermanentError(Exception):
    """Raise from a task to fail the job for good: no retry, straight to ``dead_letter``.

    Use ``raise PermanentError("why") from error`` to keep the original error in the
    traceback that is stored with the job.
    """


#: Longest snooze accepted: a year. Longer is surely a unit mistake (milliseconds?).
SNOOZE_MAX_SECONDS = 366 * 86400


class Snooze(Exception):
    """Raise (or return) from a task to run the job again later without using an attempt.

    ``Snooze(30)`` or ``Snooze(timedelta(minutes=5))``: the job goes back to the queue,
    ready again that long after the worker records it (database clock). Its attempt
    count is given back, its history gains a "snoozed" entry, and its ``snoozes`` count
    grows; past the task's ``max_snoozes`` (``PGQUEUE_MAX_SNOOZES``) the job is
    dead-lettered with :class:`SnoozeLimitReached` instead, so it cannot snooze forever.

    Bad input is refused here, in the handler, as :class:`InvalidOption`: the attempt
    then fails like any other error.
    """

    def __init__(self, seconds: float | timedelta) -> None:
        if isinstance(seconds, timedelta):
            value = seconds.total_seconds()
        elif isinstance(seconds, int | float) and not isinstance(seconds, bool):
            value = float(seconds)
        else:
            raise InvalidOption(
                "Snooze(seconds)", f"must be a number of seconds or a timedelta, not {seconds!r}"
            )
        if not math.isfinite(value) or not 0 <= value <= SNOOZE_MAX_SECONDS:
            raise InvalidOption(
                "Snooze(seconds)",
                f"{seconds!r} is not between 0 and {SNOOZE_MAX_SECONDS} seconds (a year)",
            )
        self.seconds = value
        super().__init__(f"snoozed for {value:g}s")


class SnoozeLimitReached(PgQueueError):
    """Recorded when a job asked to snooze more often than its task's ``max_snoozes``."""


class InvalidBatchResult(PgQueueError):
    """A batched task's handler returned something other than None or a mapping of its
    batch's job ids to outcomes; every job of the batch fails with it (and is retried)."""


# ---------------------------------------------------------------- enqueue-time errors
class EnqueueError(PgQueueError, InvalidTask):
    """The job cannot be enqueued as given; no row was written."""


class InvalidArguments(EnqueueError, TypeError):
    """An argument cannot be stored as JSON (or not without changing its meaning).

    Also a ``TypeError``, which Django's Tasks API documents for arguments that are not
    JSON-serializable, so ``except TypeError`` around ``enqueue()`` keeps working.
    """

    def __init__(self, argument: str, reason: str) -> None:
        self.argument = argument
        self.reason = reason
        super().__init__(f"{argument}: {reason}")


class PayloadTooLarge(InvalidArguments):
    """The JSON-encoded arguments exceed ``PGQUEUE_MAX_PAYLOAD_BYTES``."""

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(
            "args/kwargs",
            f"encoded payload is {size} bytes, over the limit of {limit} bytes "
            "(PGQUEUE_MAX_PAYLOAD_BYTES); store large data elsewhere and pass a reference",
        )


class UnknownQueue(EnqueueError):
    """The queue is not listed in the backend's ``QUEUES``."""

    def __init__(self, queue: str, allowed: frozenset[str] | set[str]) -> None:
        self.queue = queue
        self.allowed = frozenset(allowed)
        super().__init__(
            f"queue_name {queue!r} is not one of this backend's QUEUES: {sorted(self.allowed)}"
        )


class InvalidOption(EnqueueError):
    """A job option (priority, key, max_attempts, run_after, ...) is out of range."""

    def __init__(self, option: str, reason: str) -> None:
        self.option = option
        self.reason = reason
        super().__init__(f"{option}: {reason}")


class UnknownDependency(EnqueueError):
    """A job was enqueued ``after=`` jobs that do not exist (nothing was written)."""

    def __init__(self, job_ids: list[int]) -> None:
        self.job_ids = job_ids
        super().__init__(
            f"after= names job(s) that do not exist: {', '.join(map(str, job_ids))} "
            "(a job can only run after jobs that exist, which makes cycles impossible)"
        )


class DependencyInOtherDatabase(EnqueueError):
    """``after=`` names a job of another database than the one the new job goes to.

    Job ids are per database: the id would name another job here, or none. Nothing
    was written.
    """

    def __init__(self, job_id: int, blocker_alias: str, alias: str) -> None:
        self.job_id = job_id
        self.blocker_alias = blocker_alias
        self.alias = alias
        super().__init__(
            f"after= names job {job_id} of database {blocker_alias!r}, but this job is "
            f"enqueued in database {alias!r}: a job can only run after jobs of its own "
            "database (enqueue it with a backend on the same database)"
        )


class InvalidSchedule(ConfigurationError):
    """A periodic schedule is declared wrongly: its expression, timezone, policy or name.

    ``field`` names what was wrong; the system checks (E201-E208) report the same
    problems before a worker starts.
    """

    def __init__(self, schedule: str, field: str, reason: str) -> None:
        self.schedule = schedule
        self.field = field
        super().__init__(f"schedule {schedule!r}: {field} {reason}")
