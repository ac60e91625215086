"""The ``django.tasks`` backend: jobs in PostgreSQL, run by ``manage.py runqueueworker``.

Configure it in ``TASKS``::

    TASKS = {
        "default": {
            "BACKEND": "django_pgqueue.backend.PgQueueBackend",
            "QUEUES": ["default", "emails"],
            "OPTIONS": {"DATABASE": "default"},  # optional
        }
    }
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any, Self

from django.apps import apps
from django.conf import settings
from django.core import checks
from django.db import DatabaseError, connections
from django.utils import timezone
from django.utils.module_loading import import_string

from django_pgqueue.compat import (
    TASK_MAX_PRIORITY,
    TASK_MIN_PRIORITY,
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskError,
    TaskResult,
    TaskResultStatus,
    task_backends,
    task_enqueued,
)
from django_pgqueue.exceptions import (
    AppNotInstalled,
    InvalidOption,
    JobNotFound,
    NotMigrated,
    NotPostgreSQL,
    UnknownQueue,
    UnknownTask,
)
from django_pgqueue.limits import (
    QUEUE_MAX_LENGTH,
)
from django_pgqueue.states import BlockerFailure, JobStatus
from django_pgqueue.store.queue import QueueStore
from django_pgqueue.store.tables import is_undefined_table
from django_pgqueue.store.values import Enqueued, JobSnapshot, JobSpec
from django_pgqueue.tasks.middleware import Enqueue, MiddlewareError, enqueue_chain
from django_pgqueue.tasks.options import validate_options
from django_pgqueue.tasks.results import build_result

__all__ = ["PgQueueBackend", "PgQueueTask", "configured_queues", "resolve_task"]

_STATUS_MAP = {
    JobStatus.BLOCKED: TaskResultStatus.READY,
    JobStatus.PENDING: TaskResultStatus.READY,
    JobStatus.PROCESSING: TaskResultStatus.RUNNING,
    JobStatus.SUCCEEDED: TaskResultStatus.SUCCESSFUL,
    JobStatus.DEAD_LETTER: TaskResultStatus.FAILED,
    JobStatus.CANCELLED: TaskResultStatus.FAILED,
}
_CANCELLED_ERROR = "django_pgqueue.exceptions.JobCancelled"


@dataclass(frozen=True, slots=True, kw_only=True)
class PgQueueTask(Task):  # type: ignore[type-arg]
    """A ``django.tasks`` task with the options of a durable queue.

    Set them in the decorator (``@task(max_attempts=8, timeout=60, atomic=True)``) or per
    call with :meth:`using`.
    """

    #: Attempts before the job is dead-lettered (None: ``PGQUEUE_MAX_ATTEMPTS``).
    max_attempts: int | None = None
    #: Seconds one attempt may run before it is failed with ``JobTimeout`` (None: no cap).
    timeout: float | None = None
    #: Times a job may ``Snooze`` before it is dead-lettered (None: ``PGQUEUE_MAX_SNOOZES``).
    max_snoozes: int | None = None
    #: Run the handler and its completion in one transaction (effectively-once writes).
    atomic: bool = False
    #: Call the handler with a list of up to this many jobs of the task at once, each
    #: with its own lease and outcome (None: one job per call). See tasks/batches.py.
    batch_size: int | None = None
    #: Enqueueing again with the same key returns the existing job instead of a new one.
    idempotency_key: str | None = None
    #: Jobs sharing a partition key run one at a time, in enqueue order.
    partition_key: str | None = None
    #: While a job with this key is pending, enqueueing again returns it (with the newest
    #: arguments) instead of a new one; once it has started, a new job is made.
    coalesce_key: str | None = None
    #: With a coalesce key: each enqueue moves the pending job's start to at least this
    #: long after it (a timedelta or seconds; database clock).
    debounce: timedelta | float | None = None
    #: Jobs (task results or job ids) this one runs after: it stays ``blocked`` until
    #: they have all succeeded.
    after: tuple[Any, ...] = ()
    #: If one of them ends dead-lettered or cancelled: "cancel" this job, or "run" it.
    on_blocker_failure: str = BlockerFailure.CANCEL
    #: Jobs sharing a concurrency key run at most ``concurrency_limit`` at a time, in any
    #: order, across all workers (None: ``task:<path>`` if a limit is set).
    concurrency_key: str | None = None
    #: Jobs of this task (per concurrency key, if one is given) in flight at most.
    concurrency_limit: int | None = None
    #: Starts of this task (per concurrency key, if one is given) per period at most:
    #: ``"20/s"``, ``"1000/h"``, ``"3/10s"``.
    rate_limit: str | None = None

    def using(
        self,
        *,
        priority: int | None = None,
        queue_name: str | None = None,
        run_after: Any = None,
        backend: str | None = None,
        idempotency_key: str | None = None,
        partition_key: str | None = None,
        max_attempts: int | None = None,
        timeout: float | None = None,
        max_snoozes: int | None = None,
        coalesce_key: str | None = None,
        debounce: timedelta | float | None = None,
        after: Iterable[Any] | None = None,
        on_blocker_failure: str | None = None,
        concurrency_key: str | None = None,
    ) -> Self:
        """Return a copy with some options changed (validated at once).

        ``after``: task results (or job ids) of jobs this one runs after.
        """
        changes: dict[str, Any] = {
            name: value
            for name, value in (
                ("priority", priority),
                ("queue_name", queue_name),
                ("run_after", run_after),
                ("backend", backend),
                ("idempotency_key", idempotency_key),
                ("partition_key", partition_key),
                ("max_attempts", max_attempts),
                ("timeout", timeout),
                ("max_snoozes", max_snoozes),
                ("coalesce_key", coalesce_key),
                ("debounce", debounce),
                ("after", None if after is None else tuple(after)),
                ("on_blocker_failure", on_blocker_failure),
                ("concurrency_key", concurrency_key),
            )
            if value is not None
        }
        return replace(self, **changes)

    def enqueue_many(
        self, calls: Iterable[tuple[Sequence[Any], Mapping[str, Any]]]
    ) -> list[TaskResult]:  # type: ignore[type-arg]
        """Enqueue one job per ``(args, kwargs)`` pair with a single INSERT statement.

        All calls share this task's options; an idempotency key (if set) applies to all of
        them, so use :meth:`QueueStore.enqueue_many` for per-job keys.
        """
        backend = self.get_backend()
        if not isinstance(backend, PgQueueBackend):
            raise InvalidTask(f"enqueue_many needs a PgQueueBackend, not {type(backend).__name__}")
        return backend.enqueue_many(self, calls)


class PgQueueBackend(BaseTaskBackend):
    """Stores tasks as jobs in PostgreSQL; ``runqueueworker`` runs them."""

    task_class = PgQueueTask

    # run_after becomes the job's available_at; workers compare it with the database clock.
    supports_defer = True
    # Coroutine functions run on the worker's event loop.
    supports_async_task = True
    # Results, errors and timestamps live in the job row, readable from any process.
    supports_get_result = True
    # Higher priority jobs are claimed first within a queue.
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.database: str = self.options.get("DATABASE", "default")

    # ------------------------------------------------------------------ validation
    def validate_task(self, task: Task) -> None:  # type: ignore[type-arg]
        """Raise a typed :class:`InvalidTask` subclass naming the first invalid option."""
        if (
            isinstance(task.priority, bool)
            or not isinstance(task.priority, int)
            or not TASK_MIN_PRIORITY <= task.priority <= TASK_MAX_PRIORITY
        ):
            raise InvalidOption(
                "priority",
                f"{task.priority!r} is not a whole number between {TASK_MIN_PRIORITY} "
                f"and {TASK_MAX_PRIORITY}",
            )
        if self.queues and task.queue_name not in self.queues:
            raise UnknownQueue(task.queue_name, self.queues)
        if task.run_after is not None and settings.USE_TZ and timezone.is_naive(task.run_after):
            raise InvalidOption("run_after", "must be an aware datetime (USE_TZ is True)")
        if isinstance(task, PgQueueTask):
            validate_options(task)
        super().validate_task(task)

    # ------------------------------------------------------------------ enqueue
    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:  # type: ignore[type-arg]
        """Insert the job in the current transaction of the backend's database.

        Runs through ``PGQUEUE_MIDDLEWARE`` first, if any is listed. Raises
        :class:`NotMigrated` if the database has no queue tables and
        :class:`AppNotInstalled` if ``django_pgqueue`` is not in ``INSTALLED_APPS``.
        """
        chain = enqueue_chain(_enqueue_through)
        if chain is None:
            return self._enqueue_one(task, args, kwargs)
        results = chain(Enqueue(task=task, backend=self.alias, calls=[(args, dict(kwargs))]))
        return _one_result(results)

    def _enqueue_one(self, task: Task, args: Any, kwargs: Any) -> TaskResult:  # type: ignore[type-arg]
        self.validate_task(task)
        spec = self._spec(task, args, kwargs)
        with self._schema_errors():
            outcome = self._store().enqueue(spec)
        inserted = outcome.inserted
        if inserted is None or spec.after:
            result = self._result(task, outcome.snapshot)
        else:
            # A new job: everything is known, no snapshot or history to decode.
            result = self._new_result(task, outcome.id, inserted[0], args, kwargs)
        if outcome.created:
            task_enqueued.send(type(self), task_result=result)
        return result

    def _new_result(
        self,
        task: Task,  # type: ignore[type-arg]
        job_id: int,
        created_at: Any,
        args: Any,
        kwargs: Any,
    ) -> TaskResult:  # type: ignore[type-arg]
        return TaskResult(
            task=task,
            id=str(job_id),
            status=TaskResultStatus.READY,
            enqueued_at=created_at,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=list(args),
            kwargs=dict(kwargs),
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )

    def enqueue_many(
        self,
        task: Task,  # type: ignore[type-arg]
        calls: Iterable[tuple[Sequence[Any], Mapping[str, Any]]],
    ) -> list[TaskResult]:  # type: ignore[type-arg]
        """Insert one job per ``(args, kwargs)`` with a single statement (after the middleware)."""
        chain = enqueue_chain(_enqueue_through)
        if chain is None:
            return self._enqueue_calls(task, calls)
        listed = [(args, dict(kwargs)) for args, kwargs in calls]
        results = chain(Enqueue(task=task, backend=self.alias, calls=listed))
        if not isinstance(results, list) or len(results) != len(listed):
            raise MiddlewareError("the chain", f"returned {results!r}, not one result per call")
        return results

    def _enqueue_calls(
        self,
        task: Task,  # type: ignore[type-arg]
        calls: Iterable[tuple[Sequence[Any], Mapping[str, Any]]],
    ) -> list[TaskResult]:  # type: ignore[type-arg]
        self.validate_task(task)
        template = self._spec(task, (), {})
        with self._schema_errors():
            outcomes = self._store().enqueue_calls(template, calls)
        results = []
        for outcome in outcomes:
            result = self._inserted_result(task, outcome) or self._result(task, outcome.snapshot)
            if outcome.created:
                task_enqueued.send(type(self), task_result=result)
            results.append(result)
        return results

    def _store(self) -> QueueStore:
        # Without the app, importing the models fails with Django's app_label error, which
        # does not say what to do; E003 does (Django 6 runs no backend check until
        # django.tasks is imported, so `check` may not have said it either).
        if not apps.is_installed("django_pgqueue"):
            raise AppNotInstalled(self.alias)
        self._require_postgresql()
        from django_pgqueue.models import Job

        return Job.objects.store(self.database)

    def _require_postgresql(self) -> None:
        # Another database fails on the first placeholder with a syntax error that says
        # nothing about the cause; E001 does, but only if someone ran the checks.
        vendor = connections[self.database].vendor
        if vendor != "postgresql":
            raise NotPostgreSQL(self.database, vendor, self._database_setting(), self.alias)

    def _database_setting(self) -> str:
        # Name only what the user wrote: OPTIONS['DATABASE'] if they set it, else DATABASES.
        if "DATABASE" in self.options:
            return f"TASKS[{self.alias!r}]['OPTIONS']['DATABASE']"
        return f"DATABASES[{self.database!r}]['ENGINE']"

    @contextlib.contextmanager
    def _schema_errors(self) -> Iterator[None]:
        try:
            yield
        except DatabaseError as error:
            if is_undefined_table(error):
                raise NotMigrated(self.database) from None
            raise

    def _spec(self, task: Task, args: Any, kwargs: Any) -> JobSpec:  # type: ignore[type-arg]
        return JobSpec(args=args, kwargs=kwargs, **self._spec_options(task))

    def _spec_options(self, task: Task) -> dict[str, Any]:  # type: ignore[type-arg]
        """Return the :class:`JobSpec` fields ``task`` gives every job (all but arguments)."""
        options = task if isinstance(task, PgQueueTask) else None
        return {
            "task_path": task.module_path,
            "queue": task.queue_name,
            "priority": task.priority,
            "max_attempts": options.max_attempts if options else None,
            "available_at": task.run_after,
            "idempotency_key": options.idempotency_key if options else None,
            "partition_key": options.partition_key if options else None,
            "coalesce_key": options.coalesce_key if options else None,
            "debounce": options.debounce if options else None,
            "after": options.after if options else (),
            "on_blocker_failure": (
                options.on_blocker_failure if options else BlockerFailure.CANCEL
            ),
            "concurrency_key": options.concurrency_key if options else None,
            "concurrency_limit": options.concurrency_limit if options else None,
            "rate_limit": options.rate_limit if options else None,
        }

    # ------------------------------------------------------------------ results
    def get_result(self, result_id: str) -> TaskResult:  # type: ignore[type-arg]
        """Return the job's current state as a ``TaskResult``.

        Raises ``TaskResultDoesNotExist`` (as :class:`JobNotFound`) for unknown ids, and
        :class:`UnknownTask` if the job's task can no longer be imported.
        """
        from django_pgqueue.models import Job

        self._require_postgresql()
        try:
            job_id = int(result_id)
        except (TypeError, ValueError):
            raise JobNotFound(result_id) from None
        with self._schema_errors():
            row = Job.objects.using(self.database).filter(pk=job_id).values().first()
        if row is None:
            raise JobNotFound(result_id)
        job = JobSnapshot.from_row(row)
        return self._result(resolve_task(job.task_path), job)

    def _inserted_result(self, task: Task, outcome: Enqueued) -> TaskResult | None:  # type: ignore[type-arg]
        """Return the result of a job this call inserted ready to run, else None.

        The same value :meth:`_result` builds from the job's snapshot, without building
        the snapshot: a bulk enqueue describes thousands of new jobs at once.
        """
        inserted = outcome.inserted_pending()
        if inserted is None:
            return None
        job_id, created_at, args_json, kwargs_json = inserted
        return build_result(
            task=task,
            job_id=str(job_id),
            status=TaskResultStatus.READY,
            enqueued_at=created_at,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            # The stored JSON, read back: what the worker will pass to the task.
            args=_decoded(args_json),
            kwargs=_decoded(kwargs_json),
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )

    def _result(self, task: Task, job: JobSnapshot) -> TaskResult:  # type: ignore[type-arg]
        status = JobStatus(job.status)
        if task.queue_name != job.queue or task.priority != job.priority:
            # If the job's queue is no longer configured, report the task as defined.
            with contextlib.suppress(InvalidTask):
                task = replace(task, queue_name=job.queue, priority=job.priority)
        history = list(job.errors or [])
        errors = [
            TaskError(
                exception_class_path=str(entry.get("exception_class", "")),
                traceback=str(entry.get("traceback") or entry.get("message", "")),
            )
            for entry in history
            # A snooze ran on a worker (worker_ids names it) but raised no error.
            if "snoozed" not in entry
        ]
        if status is JobStatus.CANCELLED:
            errors.append(
                TaskError(
                    exception_class_path=_CANCELLED_ERROR,
                    traceback=f"cancelled: {job.last_error or 'by an operator'}",
                )
            )
        worker_ids = [str(entry.get("worker", "")) for entry in history]
        if job.claimed_by and status in {JobStatus.PROCESSING, JobStatus.SUCCEEDED}:
            worker_ids.append(job.claimed_by)
        result: TaskResult[..., Any] = TaskResult(
            task=task,
            id=str(job.id),
            status=_STATUS_MAP[status],
            enqueued_at=job.created_at,
            started_at=job.started_at,
            finished_at=job.finished_at,
            last_attempted_at=job.claimed_at,
            args=list(job.args),
            kwargs=dict(job.kwargs),
            backend=self.alias,
            errors=errors,
            worker_ids=worker_ids,
        )
        if status is JobStatus.SUCCEEDED:
            object.__setattr__(result, "_return_value", job.result)
        return result

    # ------------------------------------------------------------------ checks
    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """Report configuration problems of this backend (IDs ``django_pgqueue.E00x``)."""
        messages: list[checks.CheckMessage] = []
        if not apps.is_installed("django_pgqueue"):
            messages.append(
                checks.Error(
                    f"TASKS[{self.alias!r}] uses PgQueueBackend but django_pgqueue is not in "
                    "INSTALLED_APPS.",
                    hint="Add 'django_pgqueue' to INSTALLED_APPS and run migrate.",
                    id="django_pgqueue.E003",
                )
            )
        if self.database not in connections:
            messages.append(
                checks.Error(
                    f"TASKS[{self.alias!r}]['OPTIONS']['DATABASE'] is {self.database!r}, which "
                    "is not in DATABASES.",
                    id="django_pgqueue.E006",
                )
            )
        elif connections[self.database].vendor != "postgresql":
            messages.append(
                checks.Error(
                    f"TASKS[{self.alias!r}] stores jobs in database {self.database!r}, which "
                    f"uses {connections[self.database].vendor}; django-pgqueue needs PostgreSQL.",
                    hint=self._postgresql_hint(),
                    id="django_pgqueue.E001",
                )
            )
        messages.extend(_check_queues(self.alias, self.queues))
        return messages

    def _postgresql_hint(self) -> str:
        setting = self._database_setting()
        if "DATABASE" in self.options:
            return f"Point {setting} at a database whose ENGINE is 'django.db.backends.postgresql'."
        return f"Set {setting} to 'django.db.backends.postgresql'."


def _decoded(payload: str) -> Any:
    # A task without arguments is the common case of a bulk enqueue: skip the decoder.
    if payload == "[]":
        return []
    if payload == "{}":
        return {}
    return json.loads(payload)


def _check_queues(alias: str, queues: set[str]) -> list[checks.CheckMessage]:
    problems = [
        queue
        for queue in queues
        if not isinstance(queue, str) or not queue or len(queue) > QUEUE_MAX_LENGTH
    ]
    if not problems and queues:
        return []
    return [
        checks.Error(
            f"TASKS[{alias!r}]['QUEUES'] must be a non-empty list of queue names of 1 to "
            f"{QUEUE_MAX_LENGTH} characters; invalid: {problems!r}",
            id="django_pgqueue.E005",
        )
    ]


def resolve_task(task_path: str) -> Task:  # type: ignore[type-arg]
    """Import the task stored at ``task_path``; raise :class:`UnknownTask` if impossible."""
    try:
        candidate = import_string(task_path)
    except ImportError as error:
        raise UnknownTask(task_path, f"cannot be imported ({error})") from error
    except Exception as error:  # a module that fails at import time
        raise UnknownTask(
            task_path, f"importing it raised {type(error).__name__}: {error}"
        ) from error
    if not isinstance(candidate, Task):
        raise UnknownTask(task_path, f"is a {type(candidate).__name__}, not a task")
    return candidate


def configured_queues() -> set[str]:
    """Return the queues named in ``TASKS`` by the backends of this package."""
    queues: set[str] = set()
    for alias in task_backends.settings:
        backend = task_backends[alias]
        if isinstance(backend, PgQueueBackend):
            queues.update(backend.queues)
    return queues


def _enqueue_through(call: Enqueue) -> list[TaskResult]:  # type: ignore[type-arg]
    """The innermost step of PGQUEUE_MIDDLEWARE around an enqueue: write the calls."""
    backend = task_backends[call.backend]
    assert isinstance(backend, PgQueueBackend)
    if len(call.calls) == 1:
        args, kwargs = call.calls[0]
        return [backend._enqueue_one(call.task, args, kwargs)]
    return backend._enqueue_calls(call.task, call.calls)


def _one_result(results: Any) -> TaskResult:  # type: ignore[type-arg]
    if not isinstance(results, list) or len(results) != 1:
        raise MiddlewareError("the chain", f"returned {results!r}, not the enqueue's one result")
    result: TaskResult = results[0]  # type: ignore[type-arg]
    return result
