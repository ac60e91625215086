"""Running one claimed job: resolve its task, bind its arguments, call it, report.

Nothing here touches the queue's own connections: the outcome goes back to the
dispatcher, which records it with a fenced write. The exception is an ``atomic=True``
task, whose completion is written inside the handler's own transaction so both commit or
roll back together.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import close_old_connections, transaction
from django.utils import timezone

from django_pgqueue.compat import (
    TaskError,
    TaskResult,
    TaskResultStatus,
    task_finished,
    task_started,
)
from django_pgqueue.exceptions import (
    JobTimeout,
    LeaseLost,
    Snooze,
)
from django_pgqueue.features.periodic import parse_fire_key
from django_pgqueue.store.payload import StoredResult, encode_result
from django_pgqueue.store.queue import QueueStore
from django_pgqueue.store.runners import DjangoRunner
from django_pgqueue.store.tracing import attempt_span, record_exception, recording, set_outcome
from django_pgqueue.store.values import ClaimedJob, Failure
from django_pgqueue.tasks.backend import PgQueueBackend
from django_pgqueue.tasks.context import JobContext
from django_pgqueue.tasks.middleware import Attempt, attempt_chain
from django_pgqueue.tasks.results import build_result, unshared
from django_pgqueue.worker.failures import ARGUMENTS_MISMATCH, cancelled_failure, failure_from
from django_pgqueue.worker.flight import InFlight

__all__ = [
    "JobRunner",
    "Outcome",
    "OutcomeKind",
    "span_outcome",
    "stored_result",
]

logger = logging.getLogger("django_pgqueue.worker")


class OutcomeKind(enum.Enum):
    """What to record for a finished attempt."""

    SUCCEEDED = "succeeded"  # complete it (batched)
    FAILED = "failed"  # fail it: retry later or dead-letter
    RELEASE = "release"  # give it back without using an attempt
    SNOOZED = "snoozed"  # the handler asked to run again later, without using an attempt
    COMMITTED = "committed"  # an atomic task already completed it in its transaction
    LOST = "lost"  # the lease was gone: nothing to record


@dataclass(slots=True)
class Outcome:
    """The result of one attempt, on its way to the database."""

    flight: InFlight
    kind: OutcomeKind
    result_json: str = "null"
    failure: Failure | None = None
    delay: float = 0.0
    reason: str | None = None
    #: Shown as the job's last error class while it waits (a release only).
    reason_class: str | None = None
    #: Starts the unknown-task window (a release for an unknown task only).
    unknown_since: datetime | None = None
    duration: float = 0.0
    #: Jobs whose outcomes one handler call decided (a batch): each is charged
    #: ``duration / shared_by`` of a thread's time.
    shared_by: int = 1
    #: Set once the outcome is recorded, so a retry after a connection loss skips it.
    written: bool = False


_SPAN_OUTCOMES = {
    OutcomeKind.SUCCEEDED: "succeeded",
    OutcomeKind.COMMITTED: "succeeded",
    OutcomeKind.FAILED: "failed",
    OutcomeKind.RELEASE: "released",
    OutcomeKind.SNOOZED: "snoozed",
    OutcomeKind.LOST: "lease_lost",
}


def span_outcome(flight: InFlight, outcome: Outcome) -> str:
    # A sync handler past its timeout is failed with JobTimeout once it returns.
    if flight.overdue:
        return "timeout"
    return "abandoned" if flight.abandoned else _SPAN_OUTCOMES[outcome.kind]


class JobRunner:
    """Runs jobs in the calling thread (sync tasks) or on an event loop (async tasks)."""

    def __init__(
        self,
        *,
        backend_alias: str,
        database: str,
        worker_id: str,
        record_step: Callable[[ClaimedJob, str | None], None],
    ) -> None:
        self.backend_alias = backend_alias
        self.database = database
        self.worker_id = worker_id
        self._record_step = record_step
        # Built now, so a bad PGQUEUE_MIDDLEWARE stops the worker at start (MiddlewareError).
        self._chain = attempt_chain(is_async=False)
        self._achain = attempt_chain(is_async=True)

    # ------------------------------------------------------------------ shared parts
    def _task_result(self, flight: InFlight) -> TaskResult:  # type: ignore[type-arg]
        job = flight.job
        assert flight.entry is not None
        # The task is called with job.args and job.kwargs themselves: the result gets
        # copies, as the constructor's normalize_json would give it.
        return build_result(
            task=flight.entry.task,
            job_id=str(job.id),
            status=TaskResultStatus.RUNNING,
            enqueued_at=job.created_at,
            started_at=job.claimed_at,
            finished_at=None,
            last_attempted_at=job.claimed_at,
            args=unshared(job.args),
            kwargs=unshared(job.kwargs),
            backend=self.backend_alias,
            errors=[],
            worker_ids=[*job.prior_workers, self.worker_id],
        )

    def _call_arguments(
        self,
        flight: InFlight,
        task_result: TaskResult,  # type: ignore[type-arg]
        record_step: Callable[[str | None], None],
    ) -> list[Any]:
        """Return the positional arguments of the call (the context first, if taken)."""
        job = flight.job
        entry = flight.entry
        assert entry is not None
        if not entry.takes_context:
            return job.args
        fire = parse_fire_key(job.idempotency_key)
        context = JobContext(
            task_result=task_result,
            job_id=job.id,
            attempts=job.attempts,
            lease_generation=job.lease_generation,
            worker_id=self.worker_id,
            initial_step=job.step,
            schedule=fire.schedule if fire else None,
            fire_time=fire.fire_time if fire else None,
            _cancel_event=flight.cancel,
            _record_step=record_step,
        )
        return [context, *job.args]

    def _attempt(self, flight: InFlight, args: list[Any]) -> Attempt:
        """Describe the attempt for PGQUEUE_MIDDLEWARE (``args`` as the task gets them)."""
        entry = flight.entry
        assert entry is not None
        job = flight.job
        return Attempt(
            job_id=job.id,
            task=entry.task,
            task_path=job.task_path,
            queue=job.queue,
            attempt=job.attempts,
            worker_id=self.worker_id,
            args=args[1:] if entry.takes_context else args,
            kwargs=job.kwargs,
            context=args[0] if entry.takes_context else None,
            is_async=entry.is_async,
        )

    @staticmethod
    def _explain(error: BaseException, flight: InFlight, args: list[Any]) -> BaseException:
        """Mark a TypeError from arguments that do not bind as permanent (no retry).

        The error stays what it is (class and message as Python raised it); a note names
        the task's signature. Binding is only checked after a TypeError, so the common
        path pays nothing; a TypeError raised inside the task (with arguments that do
        bind) stays retryable.
        """
        entry = flight.entry
        if not isinstance(error, TypeError) or entry is None:
            return error
        try:
            if entry.batch_size is not None:
                entry.signature.bind(*args)
            else:
                entry.signature.bind(*args, **flight.job.kwargs)
        except TypeError:
            setattr(error, ARGUMENTS_MISMATCH, True)
            error.add_note(
                f"django-pgqueue: the job's arguments do not match "
                f"{flight.job.task_path}{entry.signature}; it will not be retried"
                if entry.batch_size is None
                else f"django-pgqueue: {flight.job.task_path}{entry.signature} cannot be "
                "called with a list of jobs (it is declared with batch_size); it will not "
                "be retried"
            )
        return error

    def _finish_signal(
        self,
        task_result: TaskResult,  # type: ignore[type-arg]
        status: TaskResultStatus,
        *,
        value: Any = None,
        error: BaseException | None = None,
    ) -> None:
        object.__setattr__(task_result, "status", status)
        object.__setattr__(task_result, "finished_at", timezone.now())
        if error is not None:
            kind = type(error)
            task_result.errors.append(
                TaskError(
                    exception_class_path=f"{kind.__module__}.{kind.__qualname__}",
                    traceback="".join(traceback.format_exception(error)),
                )
            )
        else:
            object.__setattr__(task_result, "_return_value", value)
        _send_finished(task_result)

    def _failed(
        self,
        flight: InFlight,
        task_result: TaskResult,  # type: ignore[type-arg]
        raised: BaseException,
        args: list[Any] | None,
        started: float,
    ) -> Outcome:
        """Report a failed attempt; call it inside the ``except`` block (for exc_info).

        ``args`` None: the error was explained already (a batch's, once for all jobs).
        """
        error = raised if args is None else self._explain(raised, flight, args)
        record_exception(error)
        self._finish_signal(task_result, TaskResultStatus.FAILED, error=error)
        return Outcome(
            flight,
            OutcomeKind.FAILED,
            failure=failure_from(error),
            duration=time.monotonic() - started,
        )

    def _snoozed(
        self,
        flight: InFlight,
        task_result: TaskResult,  # type: ignore[type-arg]
        snooze: Snooze,
        started: float,
    ) -> Outcome:
        """Report an attempt that asked to run again later (see :class:`Snooze`).

        ``task_finished`` is sent with status READY: the attempt is over (receivers
        that pair it with ``task_started`` stay paired) and the job is waiting again.
        """
        object.__setattr__(task_result, "status", TaskResultStatus.READY)
        _send_finished(task_result)
        return Outcome(
            flight,
            OutcomeKind.SNOOZED,
            delay=snooze.seconds,
            duration=time.monotonic() - started,
        )

    def _succeeded(
        self,
        flight: InFlight,
        task_result: TaskResult,  # type: ignore[type-arg]
        value: Any,
        result_json: str,
        started: float,
        *,
        kind: OutcomeKind = OutcomeKind.SUCCEEDED,
    ) -> Outcome:
        """Report a successful attempt."""
        self._finish_signal(task_result, TaskResultStatus.SUCCESSFUL, value=value)
        return Outcome(flight, kind, result_json, duration=time.monotonic() - started)

    # ------------------------------------------------------------------ sync tasks
    def run_sync(self, flight: InFlight) -> Outcome:
        """Run a sync task in this thread (in a trace span) and return its outcome."""
        if not recording():
            return self._run_sync(flight)
        with attempt_span(flight.job) as span:
            outcome = self._run_sync(flight)
            set_outcome(span, span_outcome(flight, outcome))
            return outcome

    def _run_sync(self, flight: InFlight) -> Outcome:
        entry = flight.entry
        assert entry is not None
        job = flight.job
        started = flight.started_at if flight.started_at is not None else time.monotonic()
        flight.started_at = started
        if entry.timeout is not None:
            flight.deadline = started + entry.timeout
        # Like a request: drop connections that broke or outlived CONN_MAX_AGE.
        close_old_connections()
        task_result = self._task_result(flight)
        if entry.atomic:
            return self._run_atomic(flight, task_result, started)
        # Step writes go through this thread's own Django connection: they never queue
        # behind another job's bookkeeping (and join the handler's transaction, if it
        # opened one). The store is made only when a step is written: most jobs write none.
        database = self.database
        args = self._call_arguments(
            flight,
            task_result,
            lambda step: QueueStore(DjangoRunner(database)).set_step_if_leased(job.lease, step),
        )
        try:
            task_started.send(PgQueueBackend, task_result=task_result)
            if self._chain is None:
                value = entry.func(*args, **job.kwargs)
            else:
                value = self._chain(self._attempt(flight, args))
        except Snooze as snooze:
            return self._snoozed(flight, task_result, snooze, started)
        except BaseException as raised:  # SystemExit and KeyboardInterrupt are failures too
            return self._failed(flight, task_result, raised, args, started)
        if isinstance(value, Snooze):
            return self._snoozed(flight, task_result, value, started)
        stored = stored_result(job, value)
        return self._succeeded(flight, task_result, stored.value, stored.json, started)

    def _run_atomic(
        self,
        flight: InFlight,
        task_result: TaskResult,  # type: ignore[type-arg]
        started: float,
    ) -> Outcome:
        # The handler's writes and the fenced completion share one transaction on this
        # thread's Django connection: if the lease was lost, both roll back.
        entry = flight.entry
        assert entry is not None
        job = flight.job
        store = QueueStore(DjangoRunner(self.database))
        args = self._call_arguments(
            flight, task_result, lambda step: store.set_step_if_leased(job.lease, step)
        )
        try:
            with transaction.atomic(using=self.database):
                task_started.send(PgQueueBackend, task_result=task_result)
                if self._chain is None:
                    value = entry.func(*args, **job.kwargs)
                else:
                    value = self._chain(self._attempt(flight, args))
                if isinstance(value, Snooze):
                    # Returned or raised, a snooze rolls the handler's writes back: the
                    # job runs again, and its writes must not be there twice.
                    raise value
                stored = stored_result(job, value)
                store.complete_if_leased(job.lease, stored.json)
                flight.committing = True
            # Committed: the job is finished in the database, its lease is no longer
            # held by anyone and must not be extended or reported lost.
            flight.committed = True
        except LeaseLost as error:
            # The completion was refused and the handler's writes rolled back: the lease
            # was lost, or an operator asked to cancel the job while it ran. Record it as
            # a failure; fail_if_leased turns a requested cancel into cancelled, and
            # refuses (changes nothing) if the lease is gone.
            self._finish_signal(task_result, TaskResultStatus.FAILED, error=error)
            return Outcome(
                flight,
                OutcomeKind.FAILED,
                failure=cancelled_failure("its transaction was rolled back"),
                duration=time.monotonic() - started,
            )
        except Snooze as snooze:
            return self._snoozed(flight, task_result, snooze, started)
        except BaseException as raised:  # SystemExit and KeyboardInterrupt are failures too
            return self._failed(flight, task_result, raised, args, started)
        return self._succeeded(
            flight, task_result, stored.value, stored.json, started, kind=OutcomeKind.COMMITTED
        )

    # ------------------------------------------------------------------ async tasks
    async def run_async(self, flight: InFlight) -> Outcome:
        """Run a coroutine task (in a trace span) and return its outcome."""
        if not recording():
            return await self._run_async(flight)
        with attempt_span(flight.job) as span:
            outcome = await self._run_async(flight)
            set_outcome(span, span_outcome(flight, outcome))
            return outcome

    async def _run_async(self, flight: InFlight) -> Outcome:
        entry = flight.entry
        assert entry is not None
        job = flight.job
        started = flight.started_at if flight.started_at is not None else time.monotonic()
        flight.started_at = started
        task_result = self._task_result(flight)

        def record_step(step: str | None) -> None:
            self._record_step(job, step)

        args = self._call_arguments(flight, task_result, record_step)
        try:
            task_started.send(PgQueueBackend, task_result=task_result)
            if self._achain is None:
                coroutine = entry.func(*args, **job.kwargs)
            else:
                coroutine = self._achain(self._attempt(flight, args))
            if entry.timeout is not None:
                flight.deadline = started + entry.timeout
                try:
                    async with asyncio.timeout(entry.timeout) as scope:
                        value = await coroutine
                except TimeoutError as error:
                    if not scope.expired():
                        raise  # the task's own TimeoutError, not our timeout
                    raise JobTimeout(
                        f"{job.task_path} ran longer than its timeout of {entry.timeout}s"
                    ) from error
            else:
                value = await coroutine
        except asyncio.CancelledError:
            raise
        except Snooze as snooze:
            return self._snoozed(flight, task_result, snooze, started)
        except BaseException as raised:  # SystemExit and KeyboardInterrupt are failures too
            return self._failed(flight, task_result, raised, args, started)
        if isinstance(value, Snooze):
            return self._snoozed(flight, task_result, value, started)
        stored = stored_result(job, value)
        return self._succeeded(flight, task_result, stored.value, stored.json, started)


def _send_finished(task_result: TaskResult) -> None:  # type: ignore[type-arg]
    for receiver, response in task_finished.send_robust(PgQueueBackend, task_result=task_result):
        if isinstance(response, Exception):
            logger.error("task_finished receiver %r raised", receiver, exc_info=response)


def stored_result(job: ClaimedJob, value: Any) -> StoredResult:
    """Return ``value`` as it will be stored; warn if it had to be replaced by a note.

    The job still succeeds: its work is done, and a retry would do it twice.
    """
    stored = encode_result(value)
    if stored.problem is not None:
        logger.warning(
            "job %s: the return value of %s cannot be stored (%s); the job succeeded and "
            "its result is a note saying so",
            job.id,
            job.task_path,
            stored.problem,
        )
    return stored
