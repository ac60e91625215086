"""The worker: claim, run, record, repeat; recover from faults; shut down cleanly.

The dispatcher (this module, in the calling thread) owns the claim/record connection.
It claims batches sized to free capacity, hands jobs to the thread pool or the event
loop, and records outcomes in batches with fenced writes. Around it run the listener
(wake-ups), the heartbeat (leases, registry, ring, statistics) and the housekeeper.

Signal handlers only set flags and wake the dispatcher; all shutdown work happens in the
loop, never inside a handler (which could interrupt a COMMIT).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from queue import Empty, SimpleQueue
from types import FrameType
from typing import Any

from .. import __version__
from ..conf import conf
from ..exceptions import ConfigurationError, JobTimeout, LeaseLost, UnknownTask
from ..manager import ClaimedJob, Failure, Lease, QueueCounts
from ..retry import RetryPolicy
from ..states import JobStatus, WorkerStatus
from .connection import CONNECTION_ERRORS, ConnectionSlot
from .execution import InFlight, JobRunner, Outcome, OutcomeKind, TaskResolver
from .heartbeat import Heartbeat
from .housekeeping import Housekeeper
from .listener import Listener
from .options import WorkerOptions
from .pools import AsyncRunner, ThreadPool

__all__ = ["Worker"]

logger = logging.getLogger("django_pgqueue.worker")
job_logger = logging.getLogger("django_pgqueue.jobs")


class Worker:
    """One worker process's dispatcher. ``Worker(options).run()`` blocks until it exits."""

    def __init__(self, options: WorkerOptions) -> None:
        self.options = options
        self.id = options.worker_id
        self.processed = 0
        self.status = WorkerStatus.ALIVE
        self._stop_requests = 0
        self._wake = threading.Event()
        self._outcomes: SimpleQueue[Outcome] = SimpleQueue()
        self._flights: dict[int, InFlight] = {}
        self._flights_lock = threading.Lock()
        self._undelivered: list[Outcome] = []
        self._masks: tuple[str | None, ...] | None = None
        self._counts: dict[str, list[int]] = {}
        self._counts_lock = threading.Lock()
        self._rotation = 0
        self._hungry: dict[str, bool] = {}
        self._retry_policy = RetryPolicy.from_settings()
        self._slot = ConnectionSlot(options.database, f"pgqueue dispatcher {self.id}")
        self._control = ConnectionSlot(options.database, f"pgqueue heartbeat {self.id}")
        self._resolver = TaskResolver()
        self._runner = JobRunner(
            backend_alias=options.backend,
            database=options.database,
            worker_id=self.id,
            record_step=self._record_step,
        )
        self._pool: ThreadPool | None = None
        self._async = AsyncRunner(self._runner.run_async, self._deliver)
        self._listener: Listener | None = None
        self._heartbeat: Heartbeat | None = None
        self._housekeeper: Housekeeper | None = None
        self.started = threading.Event()

    # ------------------------------------------------------------------ public
    def run(self) -> int:
        """Run until stopped (signal, ``--burst`` done, ``--max-jobs`` reached); return 0."""
        with self._signal_handlers():
            if not self._register():
                return 0  # stopped before the database came up
            self._start_threads()
            self.started.set()
            logger.info(
                "worker %s started: queues=%s concurrency=%d prefetch=%d batch=%d lease=%ss",
                self.id,
                ",".join(self.options.queues),
                self.options.concurrency,
                self.options.prefetch,
                self.options.batch_size,
                self.options.lease_seconds,
            )
            try:
                self._loop()
            finally:
                self._shutdown()
        logger.info("worker %s stopped after %d jobs", self.id, self.processed)
        return 0

    def request_stop(self) -> None:
        """Begin a graceful shutdown; a second call makes it immediate. Signal-safe."""
        self._stop_requests += 1
        self._wake.set()

    # ------------------------------------------------------------------ set-up
    @contextmanager
    def _signal_handlers(self) -> Iterator[None]:
        if (
            not self.options.handle_signals
            or threading.current_thread() is not threading.main_thread()
        ):
            yield
            return

        def handler(signum: int, frame: FrameType | None) -> None:
            # Only set flags here: the loop does the work at a safe point.
            self.request_stop()

        previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)

    def _register(self) -> bool:
        backoff = 0.2
        while not self._stop_requests:
            try:
                registered = self._slot.run(
                    lambda store: store.register_worker(
                        self.id,
                        hostname=socket.gethostname(),
                        pid=os.getpid(),
                        queues=self.options.queues,
                        concurrency=self.options.concurrency,
                        metadata=self._metadata(),
                        timeout_seconds=self.options.worker_timeout,
                    )
                )
            except CONNECTION_ERRORS as error:
                logger.warning("cannot reach the database (%s); retrying in %.1fs", error, backoff)
                self._wake.wait(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            if not registered:
                raise ConfigurationError(
                    f"worker id {self.id!r} belongs to a live worker; pick another --worker-id"
                )
            return True
        return False

    def _metadata(self) -> dict[str, Any]:
        return {
            "version": __version__,
            "backend": self.options.backend,
            "prefetch": self.options.prefetch,
            "lease_seconds": self.options.lease_seconds,
        }

    def _start_threads(self) -> None:
        options = self.options
        self._pool = ThreadPool(options.concurrency, self._runner.run_sync, self._deliver)
        self._listener = Listener(
            alias=options.database,
            channel=conf.NOTIFY_CHANNEL,
            queues=options.queues,
            wake=self._wake.set,
            name=f"pgqueue listener {self.id}",
        )
        self._heartbeat = Heartbeat(
            slot=self._control,
            worker_id=self.id,
            queues=options.queues,
            concurrency=options.concurrency,
            interval=options.heartbeat_seconds,
            lease_seconds=options.lease_seconds,
            worker_timeout=options.worker_timeout,
            vnodes=conf.PARTITION_VNODES,
            held_leases=self._held_leases,
            on_leases_lost=self._leases_lost,
            take_counts=self._take_counts,
            set_masks=self._set_masks,
            status=lambda: str(self.status),
            metadata=self._metadata(),
        )
        self._listener.start()
        self._heartbeat.start()
        if options.housekeeping:
            self._housekeeper = Housekeeper(
                alias=options.database,
                interval=options.housekeeping_interval,
                worker_timeout=options.worker_timeout,
                name=f"pgqueue housekeeping {self.id}",
            )
            self._housekeeper.start()

    # ------------------------------------------------------------------ the loop
    def _loop(self) -> None:
        options = self.options
        total_slots = options.concurrency + options.prefetch
        refill_at = max(1, total_slots // 2)
        while not self._stop_requests:
            self._wake.clear()
            if not self._record_outcomes():
                self._wake.wait(0.2)  # the database is unreachable: retry soon
                continue
            self._enforce_deadlines()
            if options.max_jobs is not None and self.processed >= options.max_jobs:
                return
            with self._flights_lock:
                held = len(self._flights)
                waiting = sum(1 for flight in self._flights.values() if flight.started_at is None)
            capacity = total_slots - held
            if options.max_jobs is not None:
                capacity = min(capacity, options.max_jobs - self.processed - held)
            if capacity > 0 and (capacity >= refill_at or waiting == 0):
                try:
                    claimed, full = self._claim(min(capacity, options.batch_size))
                except CONNECTION_ERRORS as error:
                    logger.warning("claim failed, the connection was lost (%s)", error)
                    self._wake.wait(0.2)
                    continue
                for job in claimed:
                    self._dispatch(job)
                if full:
                    continue
                if options.burst and not claimed and held == 0:
                    return
            self._wake.wait(self._sleep_time())

    def _sleep_time(self) -> float:
        timeout = self.options.poll_interval
        now = time.monotonic()
        with self._flights_lock:
            deadlines = [
                f.deadline for f in self._flights.values() if f.deadline and not f.abandoned
            ]
        if deadlines:
            timeout = min(timeout, max(0.0, min(deadlines) - now) + 0.001)
        return timeout

    def _claim(self, limit: int) -> tuple[list[ClaimedJob], bool]:
        """Claim up to ``limit`` jobs shared fairly between the queues; return them and
        whether some queue filled its share (so claiming again at once is worthwhile)."""
        queues, masks, limits = self._shares(limit)
        claimed = self._slot.run(
            lambda store: store.claim(
                self.id,
                queues,
                per_queue=limits,
                lease_seconds=self.options.lease_seconds,
                bucket_masks=masks,
            )
        )
        got: dict[str, int] = dict.fromkeys(queues, 0)
        for job in claimed:
            got[job.queue] += 1
        full = False
        for queue, share in zip(queues, limits, strict=True):
            self._hungry[queue] = got[queue] >= share
            full = full or self._hungry[queue]
        if claimed:
            self._note_waits(claimed)
        return claimed, full

    def _shares(
        self, limit: int
    ) -> tuple[tuple[str, ...], tuple[str | None, ...] | None, list[int]]:
        """Split ``limit`` between the queues.

        Queues whose last share came back full ("hungry") split the capacity equally; the
        others get one slot each, enough to notice new work, after which they count as
        hungry too. With fewer slots than queues, the queues take turns.
        """
        queues = self.options.queues
        masks = self._masks
        if limit < len(queues):
            start = self._rotation % len(queues)
            self._rotation += limit
            picked = [(start + offset) % len(queues) for offset in range(limit)]
            return (
                tuple(queues[index] for index in picked),
                tuple(masks[index] for index in picked) if masks else None,
                [1] * limit,
            )
        hungry = [queue for queue in queues if self._hungry.get(queue, True)]
        if not hungry:
            hungry = list(queues)
        idle = len(queues) - len(hungry)
        share, extra = divmod(limit - idle, len(hungry))
        # The remainder goes to different hungry queues on successive claims.
        self._rotation += 1
        bonus = {hungry[(self._rotation + index) % len(hungry)] for index in range(extra)}
        limits = [share + (queue in bonus) if queue in hungry else 1 for queue in queues]
        return queues, masks, limits

    def _dispatch(self, job: ClaimedJob) -> None:
        try:
            entry = self._resolver.resolve(job.task_path)
        except UnknownTask as error:
            flight = InFlight(job, None)
            with self._flights_lock:
                self._flights[job.id] = flight
            self._deliver(self._unknown_task_outcome(flight, error))
            return
        flight = InFlight(job, entry)
        with self._flights_lock:
            self._flights[job.id] = flight
        if job_logger.isEnabledFor(logging.INFO):
            job_logger.info(
                "job %s started: task=%s queue=%s attempt=%d/%d",
                job.id,
                job.task_path,
                job.queue,
                job.attempts,
                job.max_attempts,
            )
        if entry.is_async:
            self._async.submit(flight)
        else:
            assert self._pool is not None
            self._pool.submit(flight)

    def _unknown_task_outcome(self, flight: InFlight, error: UnknownTask) -> Outcome:
        job = flight.job
        waited = (job.claimed_at - job.created_at).total_seconds()
        window = conf.UNKNOWN_TASK_TIMEOUT_SECONDS
        if waited >= window:
            failure = Failure(
                exception_class="django_pgqueue.exceptions.UnknownTask",
                message=f"unknown task: no worker could import {job.task_path!r} within "
                f"{window:.0f}s ({error.reason})",
                permanent=True,
            )
            return Outcome(flight, OutcomeKind.FAILED, failure=failure)
        # Wait for a worker that knows the task (a rolling deploy), without burning an
        # attempt, backing off from 1 to 60 seconds.
        delay = min(60.0, max(1.0, waited / 4))
        reason = f"unknown task on worker {self.id}: {error.reason}; retrying in {delay:.0f}s"
        return Outcome(flight, OutcomeKind.RELEASE, delay=delay, reason=reason)

    def _deliver(self, outcome: Outcome) -> None:
        outcome.flight.busy = False
        self._outcomes.put(outcome)
        self._wake.set()

    # ------------------------------------------------------------------ recording
    def _record_outcomes(self) -> bool:
        """Write every delivered outcome; return False if the database was unreachable."""
        outcomes = self._undelivered
        self._undelivered = []
        while True:
            try:
                outcomes.append(self._outcomes.get_nowait())
            except Empty:
                break
        if not outcomes:
            return True
        try:
            self._slot.run(lambda store: self._write_outcomes(store, outcomes))
        except CONNECTION_ERRORS as error:
            logger.warning("recording %d outcomes failed (%s); will retry", len(outcomes), error)
            self._undelivered = [outcome for outcome in outcomes if not outcome.written]
            return False
        return True

    def _write_outcomes(self, store: Any, outcomes: list[Outcome]) -> None:
        successes = [
            o for o in outcomes if o.kind is OutcomeKind.SUCCEEDED and not o.flight.abandoned
        ]
        if successes:
            done = store.complete_many_if_leased(
                self.id, [(o.flight.job.lease, o.result_json) for o in successes]
            )
            for outcome in successes:
                self._finish(
                    outcome, "succeeded" if outcome.flight.job.id in done else "lease lost"
                )
        for outcome in outcomes:
            flight = outcome.flight
            if outcome.kind is OutcomeKind.SUCCEEDED and not flight.abandoned:
                continue  # recorded above
            if flight.abandoned or outcome.kind is OutcomeKind.LOST:
                self._finish(outcome, "abandoned" if flight.abandoned else "lease lost")
            elif outcome.kind is OutcomeKind.COMMITTED:
                self._finish(outcome, "succeeded")
            elif outcome.kind is OutcomeKind.FAILED:
                assert outcome.failure is not None
                try:
                    result = store.fail_if_leased(
                        flight.job.lease, outcome.failure, self._retry_policy
                    )
                    label = (
                        "dead-lettered"
                        if result.status is JobStatus.DEAD_LETTER
                        else "failed, will retry"
                    )
                except LeaseLost:
                    label = "failed (lease lost)"
                self._finish(outcome, label)
            elif outcome.kind is OutcomeKind.RELEASE:
                try:
                    store.release_if_leased(
                        flight.job.lease, delay_seconds=outcome.delay, reason=outcome.reason
                    )
                    label = "released"
                except LeaseLost:
                    label = "release refused (lease lost)"
                self._finish(outcome, label)

    def _finish(self, outcome: Outcome, label: str) -> None:
        outcome.written = True
        job = outcome.flight.job
        with self._flights_lock:
            self._flights.pop(job.id, None)
        if outcome.flight.started_at is not None or outcome.kind is not OutcomeKind.LOST:
            self.processed += 1
        self._count(job.queue, label)
        failure = outcome.failure if label != "succeeded" else None
        if job_logger.isEnabledFor(logging.WARNING if failure else logging.INFO):
            message = "job %s %s: task=%s queue=%s attempt=%d/%d duration=%.3fs"
            args = (
                job.id,
                label,
                job.task_path,
                job.queue,
                job.attempts,
                job.max_attempts,
                outcome.duration,
            )
            if failure is None:
                job_logger.info(message, *args)
            elif label == "dead-lettered" and failure.traceback:
                # The traceback once, where someone will look: retries get one line each.
                job_logger.error(
                    message + " error=%s: %s\n%s",
                    *args,
                    failure.exception_class,
                    failure.message,
                    failure.traceback.rstrip(),
                )
            else:
                job_logger.warning(
                    message + " error=%s: %s", *args, failure.exception_class, failure.message
                )

    # ------------------------------------------------------------------ statistics
    def _note_waits(self, claimed: list[ClaimedJob]) -> None:
        with self._counts_lock:
            for job in claimed:
                wait_ms = int((job.claimed_at - job.available_at).total_seconds() * 1000)
                counts = self._counts.setdefault(job.queue, [0, 0, 0, 0])
                counts[3] = max(counts[3], wait_ms)

    def _count(self, queue: str, label: str) -> None:
        with self._counts_lock:
            counts = self._counts.setdefault(queue, [0, 0, 0, 0])
            if label == "succeeded":
                counts[0] += 1
            elif label == "dead-lettered":
                counts[2] += 1
            elif label.startswith("failed"):
                counts[1] += 1

    def _take_counts(self) -> list[QueueCounts]:
        with self._counts_lock:
            taken, self._counts = self._counts, {}
        return [QueueCounts(queue, *values) for queue, values in taken.items() if any(values)]

    # ------------------------------------------------------------------ leases
    def _held_leases(self) -> list[Lease]:
        with self._flights_lock:
            return [flight.job.lease for flight in self._flights.values() if not flight.abandoned]

    def _leases_lost(self, job_ids: set[int]) -> None:
        with self._flights_lock:
            lost = [self._flights[job_id] for job_id in job_ids if job_id in self._flights]
        for flight in lost:
            logger.warning(
                "job %s: lease lost (generation %d); abandoning it, its result will be dropped",
                flight.job.id,
                flight.job.lease_generation,
            )
            self._abandon(flight)

    def _abandon(self, flight: InFlight) -> None:
        flight.abandoned = True
        flight.cancel.set()
        if flight.entry is not None and flight.entry.is_async:
            self._async.cancel(flight)
        if not flight.busy:
            self._wake.set()

    def _set_masks(self, masks: tuple[str | None, ...]) -> None:
        self._masks = masks

    def _record_step(self, job: ClaimedJob, step: str | None) -> None:
        self._control.run(lambda store: store.set_step_if_leased(job.lease, step))

    def _enforce_deadlines(self) -> None:
        now = time.monotonic()
        with self._flights_lock:
            overdue = [
                flight
                for flight in self._flights.values()
                if flight.deadline is not None
                and flight.deadline <= now
                and not flight.abandoned
                and flight.busy
                and flight.entry is not None
                and not flight.entry.is_async  # async tasks time out with wait_for
            ]
        for flight in overdue:
            assert flight.entry is not None
            failure = Failure(
                exception_class=f"{JobTimeout.__module__}.{JobTimeout.__qualname__}",
                message=f"{flight.job.task_path} ran longer than its timeout of "
                f"{flight.entry.timeout}s; the worker stopped waiting for it",
            )
            logger.warning("job %s: timed out after %ss", flight.job.id, flight.entry.timeout)
            self._abandon(flight)
            try:
                self._fail_now(flight.job.lease, failure)
            except LeaseLost:
                pass
            except CONNECTION_ERRORS:
                logger.warning(
                    "job %s: could not record its timeout; its lease will expire", flight.job.id
                )

    def _fail_now(self, lease: Lease, failure: Failure) -> None:
        self._slot.run(lambda store: store.fail_if_leased(lease, failure, self._retry_policy))

    # ------------------------------------------------------------------ shutdown
    def _shutdown(self) -> None:
        grace_ends = time.monotonic() + self.options.grace_seconds
        self.status = WorkerStatus.DRAINING
        self._set_registry_status(WorkerStatus.DRAINING)
        # Jobs claimed but not started yet go back at once.
        with self._flights_lock:
            waiting = [
                f for f in self._flights.values() if f.started_at is None and not f.abandoned
            ]
        self._release(waiting, "worker shutting down before the job started")
        # Running jobs get the grace period, unless a second signal arrives.
        while self._stop_requests < 2:
            self._record_outcomes()
            with self._flights_lock:
                running = [f for f in self._flights.values() if f.busy and not f.abandoned]
            if not running or time.monotonic() >= grace_ends:
                break
            self._wake.wait(min(0.1, max(0.0, grace_ends - time.monotonic())))
            self._wake.clear()
        self._record_outcomes()
        with self._flights_lock:
            remaining = [f for f in self._flights.values() if not f.abandoned]
        if remaining:
            logger.warning(
                "worker %s: releasing %d unfinished jobs at shutdown", self.id, len(remaining)
            )
        self._release(remaining, "worker shut down before the job finished")
        for component in (self._listener, self._heartbeat, self._housekeeper):
            if component is not None:
                component.stop()
        if self._heartbeat is not None:
            self._heartbeat.join(5)
        self._set_registry_status(WorkerStatus.DEAD)
        if self._pool is not None:
            self._pool.shutdown()
        self._async.shutdown()
        for component in (self._listener, self._housekeeper):
            if component is not None:
                component.join(1)
        self._slot.close()
        self._control.close()

    def _release(self, flights: list[InFlight], reason: str) -> None:
        if not flights:
            return
        for flight in flights:
            self._abandon(flight)
        leases = [flight.job.lease for flight in flights]
        try:
            released = self._slot.run(
                lambda store: store.release_many_if_leased(self.id, leases, reason=reason)
            )
        except CONNECTION_ERRORS as error:
            logger.warning(
                "could not release %d jobs (%s); they come back when their leases expire",
                len(leases),
                error,
            )
            return
        with self._flights_lock:
            for flight in flights:
                if not flight.busy:
                    self._flights.pop(flight.job.id, None)
        logger.info("released %d of %d jobs: %s", len(released), len(leases), reason)

    def _set_registry_status(self, status: WorkerStatus) -> None:
        try:
            self._control.run(lambda store: store.set_worker_status(self.id, status))
        except CONNECTION_ERRORS as error:
            logger.warning("could not mark worker %s %s (%s)", self.id, status, error)
