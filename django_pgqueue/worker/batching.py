"""Gathering a batched task's jobs into one handler call (tasks declared with batch_size).

When a thread (or the event loop) is about to run a job of a batched task, the batch is
made of that job, then the same task's jobs this worker already holds and has not
started (they were claimed with every rule of the full claim: partitions, limits,
pauses), then, if there is still room, more ready plain jobs of the task claimed there
and then (``claim_batch_mates``: never a job with a partition or concurrency key, whose
turns and limits only the full claim keeps). Every job keeps its own lease, extended by
the heartbeat like any other, and its own outcome, written with its own fenced write.

A gathered job is a *mate*: it takes no slot of its own (the batch takes the leader's),
and the thread that later dequeues it finds it started and skips it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

import psycopg
from django.db import DatabaseError, close_old_connections

from django_pgqueue.compat import TaskResult, task_started
from django_pgqueue.exceptions import InvalidBatchResult, JobTimeout, Snooze
from django_pgqueue.store.tracing import attempt_span, recording, set_outcome
from django_pgqueue.store.values import ClaimedJob
from django_pgqueue.tasks.backend import PgQueueBackend
from django_pgqueue.tasks.batches import BatchJob, batch_outcomes
from django_pgqueue.tasks.middleware import Attempt
from django_pgqueue.tasks.results import unshared
from django_pgqueue.worker import observe
from django_pgqueue.worker.connection import ConnectionSlot
from django_pgqueue.worker.execution import (
    JobRunner,
    Outcome,
    OutcomeKind,
    span_outcome,
    stored_result,
)
from django_pgqueue.worker.flight import InFlight

if TYPE_CHECKING:
    from collections.abc import Callable

    from django_pgqueue.worker.options import WorkerOptions
    from django_pgqueue.worker.resolver import TaskEntry
    from django_pgqueue.worker.state import WorkerState

__all__ = ["BatchJobRunner", "Batcher"]

logger = logging.getLogger("django_pgqueue.worker")


class BatchJobRunner(JobRunner):
    """A :class:`JobRunner` that also runs a batched task's handler for many attempts."""

    def run_batch(self, flights: list[InFlight]) -> list[Outcome]:
        """Run a batched task's handler once for ``flights`` (the first one leads).

        Returns one outcome per attempt, each recorded with its own lease: a job the
        handler failed is retried alone, by its own attempts.
        """
        if not recording():
            return self._run_batch(flights)
        with attempt_span(flights[0].job) as span:
            outcomes = self._run_batch(flights)
            set_outcome(span, span_outcome(flights[0], outcomes[0]))
            return outcomes

    def _start_batch(
        self, flights: list[InFlight]
    ) -> tuple[TaskEntry, float, list[TaskResult], list[BatchJob]]:  # type: ignore[type-arg]
        entry = flights[0].entry
        assert entry is not None
        started = flights[0].started_at
        if started is None:
            started = flights[0].started_at = time.monotonic()
        deadline = None if entry.timeout is None else started + entry.timeout
        for flight in flights:
            flight.started_at = started
            flight.deadline = deadline
        results = [self._task_result(flight) for flight in flights]
        jobs = [_batch_job(flight.job) for flight in flights]
        for task_result in results:
            task_started.send(PgQueueBackend, task_result=task_result)
        return entry, started, results, jobs

    def _batch_attempt(self, flights: list[InFlight], jobs: list[BatchJob]) -> Attempt:
        """Describe the batch for PGQUEUE_MIDDLEWARE: the first job's attempt, the list."""
        attempt = self._attempt(flights[0], [jobs])
        attempt.kwargs = {}
        attempt.batch = jobs
        return attempt

    def _run_batch(self, flights: list[InFlight]) -> list[Outcome]:
        close_old_connections()
        entry, started, results, jobs = self._start_batch(flights)
        try:
            if self._chain is None:
                returned = entry.func(jobs)
            else:
                returned = self._chain(self._batch_attempt(flights, jobs))
        except Snooze as snooze:
            returned = snooze
        except BaseException as raised:  # SystemExit and KeyboardInterrupt are failures too
            return self._batch_failed(flights, results, raised, jobs, started)
        return self._batch_outcomes(flights, results, jobs, returned, started)

    async def run_batch_async(self, flights: list[InFlight]) -> list[Outcome]:
        """Run a batched coroutine task once for ``flights``; one outcome per attempt."""
        if not recording():
            return await self._run_batch_async(flights)
        with attempt_span(flights[0].job) as span:
            outcomes = await self._run_batch_async(flights)
            set_outcome(span, span_outcome(flights[0], outcomes[0]))
            return outcomes

    async def _run_batch_async(self, flights: list[InFlight]) -> list[Outcome]:
        entry, started, results, jobs = self._start_batch(flights)
        try:
            if self._achain is None:
                coroutine = entry.func(jobs)
            else:
                coroutine = self._achain(self._batch_attempt(flights, jobs))
            if entry.timeout is not None:
                try:
                    async with asyncio.timeout(entry.timeout) as scope:
                        returned = await coroutine
                except TimeoutError as error:
                    if not scope.expired():
                        raise  # the task's own TimeoutError, not our timeout
                    raise JobTimeout(
                        f"{flights[0].job.task_path} ran longer than its timeout of "
                        f"{entry.timeout}s"
                    ) from error
            else:
                returned = await coroutine
        except asyncio.CancelledError:
            raise
        except Snooze as snooze:
            returned = snooze
        except BaseException as raised:  # SystemExit and KeyboardInterrupt are failures too
            return self._batch_failed(flights, results, raised, jobs, started)
        return self._batch_outcomes(flights, results, jobs, returned, started)

    def _batch_failed(
        self,
        flights: list[InFlight],
        results: list[TaskResult],  # type: ignore[type-arg]
        raised: BaseException,
        jobs: list[BatchJob],
        started: float,
    ) -> list[Outcome]:
        """Fail every job of the batch with what the handler raised."""
        error = self._explain(raised, flights[0], [jobs])
        return _shared(
            [
                self._failed(flight, task_result, error, None, started)
                for flight, task_result in zip(flights, results, strict=True)
            ]
        )

    def _batch_outcomes(
        self,
        flights: list[InFlight],
        results: list[TaskResult],  # type: ignore[type-arg]
        jobs: list[BatchJob],
        returned: object,
        started: float,
    ) -> list[Outcome]:
        """Turn what a batched handler returned into one outcome per job.

        Each outcome says how many jobs shared the call, so the worker's measure of how
        long handlers take (adaptive prefetch) counts one call's time, not one per job.
        """
        if isinstance(returned, Snooze):
            return _shared(
                [
                    self._snoozed(flight, task_result, returned, started)
                    for flight, task_result in zip(flights, results, strict=True)
                ]
            )
        try:
            by_job = batch_outcomes(returned, jobs)
        except InvalidBatchResult as error:
            return self._batch_failed(flights, results, error, jobs, started)
        outcomes: list[Outcome] = []
        for flight, task_result in zip(flights, results, strict=True):
            value = by_job.get(flight.job.id)
            if isinstance(value, Snooze):
                outcomes.append(self._snoozed(flight, task_result, value, started))
            elif isinstance(value, BaseException):
                outcomes.append(self._failed(flight, task_result, value, None, started))
            else:
                stored = stored_result(flight.job, value)
                outcomes.append(
                    self._succeeded(flight, task_result, stored.value, stored.json, started)
                )
        return _shared(outcomes)


class Batcher:
    """Runs jobs for the thread pool and the event loop, gathering batches where declared."""

    def __init__(self, worker: WorkerState, runner: BatchJobRunner) -> None:
        self._worker = worker
        self._runner = runner
        self._options: WorkerOptions = worker.options
        # Opened on first use: a worker that runs no batched task never connects it.
        self.slot = ConnectionSlot(
            worker.options.database, f"pgqueue batches {worker.id}", claims=True
        )

    def run_sync(self, flight: InFlight) -> Outcome | list[Outcome]:
        """Run ``flight`` on its own, or as the leader of a batch."""
        entry = flight.entry
        if entry is None or entry.batch_size is None:
            return self._runner.run_sync(flight)
        return self._runner.run_batch(self.gather(flight, entry))

    async def run_async(self, flight: InFlight) -> Outcome | list[Outcome]:
        """Run a coroutine task's ``flight`` on its own, or as the leader of a batch.

        If the batch's coroutine is cancelled (the worker stopping), its mates are
        delivered as lost here and the leader by the caller.
        """
        entry = flight.entry
        if entry is None or entry.batch_size is None:
            return await self._runner.run_async(flight)
        # The claim blocks: off the event loop, like any database call of the loop's.
        group = await asyncio.to_thread(self.gather, flight, entry)
        try:
            return await self._runner.run_batch_async(group)
        except asyncio.CancelledError:
            deliver: Callable[[Outcome], None] = self._worker._deliver
            for mate in group[1:]:
                deliver(Outcome(mate, OutcomeKind.LOST))
            raise

    def gather(self, leader: InFlight, entry: TaskEntry) -> list[InFlight]:
        """Return ``leader`` and up to ``batch_size - 1`` mates, all started now."""
        size = entry.batch_size
        assert size is not None
        started = leader.started_at if leader.started_at is not None else time.monotonic()
        group = [leader]
        worker = self._worker
        task_path = leader.job.task_path
        if size > 1:
            with worker._flights_lock:
                waiting = [
                    other
                    for other in worker._flights.values()
                    if other.started_at is None
                    and other is not leader
                    and other.job.task_path == task_path
                    and not other.abandoned
                ]
            for other in waiting:
                if len(group) >= size:
                    break
                if not other.lease_may_have_expired() and other.join_batch(started):
                    group.append(other)
        room = size - len(group)
        if self._options.max_jobs is not None:
            with worker._flights_lock:
                held = len(worker._flights)
            room = min(room, self._options.max_jobs - worker.processed - held)
        if room > 0 and not worker._stop_requests:
            group.extend(self._claim_mates(leader, entry, room, started))
        return group

    def _claim_mates(
        self, leader: InFlight, entry: TaskEntry, room: int, started: float
    ) -> list[InFlight]:
        worker = self._worker
        lease_seconds = self._options.lease_seconds
        # While a long-held snapshot keeps claims from the head slow, so is this scan.
        floor = worker._cursor.mates_floor(leader.job.queue)
        sent_at = time.monotonic()
        try:
            jobs = self.slot.run(
                lambda store: store.claim_batch_mates(
                    worker.id,
                    queue=leader.job.queue,
                    task_path=leader.job.task_path,
                    limit=room,
                    lease_seconds=lease_seconds,
                    floor=floor,
                )
            )
        except (psycopg.Error, DatabaseError) as error:
            # The batch runs with what this worker holds; the jobs wait for the next.
            logger.warning(
                "job %s: could not claim more jobs for its batch (%s)", leader.job.id, error
            )
            return []
        mates = []
        for job in jobs:
            mate = InFlight(
                job,
                entry,
                started_at=started,
                lease_valid_until=sent_at + lease_seconds,
                mate=True,
            )
            with worker._flights_lock:
                worker._flights[mate.key] = mate
            observe.current.job_started(job)
            mates.append(mate)
        return mates


def _batch_job(job: ClaimedJob) -> BatchJob:
    # The handler gets copies of the arguments: its changes must not reach the
    # TaskResult the signals carry.
    return BatchJob(
        id=job.id,
        args=unshared(job.args),
        kwargs=unshared(job.kwargs),
        attempt=job.attempts,
        max_attempts=job.max_attempts,
        queue=job.queue,
        priority=job.priority,
        enqueued_at=job.created_at,
    )


def _shared(outcomes: list[Outcome]) -> list[Outcome]:
    for outcome in outcomes:
        outcome.shared_by = len(outcomes)
    return outcomes
