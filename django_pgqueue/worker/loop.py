"""The worker: claim, run, record, repeat; recover from faults; shut down cleanly.

The dispatcher (this module, in the calling thread) owns the claim connection. It claims
batches sized to free capacity and hands jobs to the thread pool or the event loop. The
recorder thread, on a connection of its own, writes outcomes in batches with fenced
writes while the next claim is under way: a claim never waits behind a completion, nor a
completion behind a claim. Around them run the listener (wake-ups), the heartbeat
(leases, registry, ring, statistics) and the housekeeper.

Signal handlers only set flags and wake the dispatcher; all shutdown work happens in the
loop, never inside a handler (which could interrupt a COMMIT).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from queue import Empty, SimpleQueue
from typing import Any

import psycopg

from .. import __version__
from ..conf import conf
from ..exceptions import ConfigurationError, JobTimeout, LeaseLost, UnknownTask
from ..notices import flow_channel, lease_channel, parse_notice
from ..retry import RetryPolicy
from ..states import JobStatus, WorkerStatus
from ..storable import storable_failure, storable_text
from ..values import ClaimedJob, Failure, Lease, QueueCounts
from . import observe
from .connection import CONNECTION_ERRORS, TRANSIENT_ERRORS, ConnectionSlot
from .execution import InFlight, JobRunner, Outcome, OutcomeKind, TaskResolver
from .exitwatch import OverdueWriteWatchdog
from .heartbeat import Heartbeat
from .housekeeping import Housekeeper
from .listener import Listener
from .logfields import job_extra
from .options import WorkerOptions
from .pacing import AdaptivePrefetch
from .pools import AsyncRunner, ThreadPool
from .scheduler import Scheduler
from .stopsignal import SignalRelay
from .tally import OutcomeTally

__all__ = ["Worker"]

logger = logging.getLogger("django_pgqueue.worker")
job_logger = logging.getLogger("django_pgqueue.jobs")

#: Outcomes of an attempt that never started are no run of the job (see ``_finish``).
_NOT_RUN = frozenset({OutcomeKind.LOST, OutcomeKind.RELEASE})


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
        # Keyed by (job id, lease generation): one entry per attempt, see InFlight.
        self._flights: dict[tuple[int, int], InFlight] = {}
        self._flights_lock = threading.Lock()
        self._undelivered: list[Outcome] = []
        # Held by whoever writes outcomes: the recorder thread, or the dispatcher once
        # the recorder has stopped (shutdown).
        self._record_lock = threading.Lock()
        self._recorder: threading.Thread | None = None
        self._recorder_stop = threading.Event()
        self._recorder_error: BaseException | None = None
        # When the outcome write under way began (monotonic), None between writes: the
        # shutdown's watchdog cancels one that outlives the grace period.
        self._write_started: float | None = None
        # While the recorder runs it wakes the dispatcher after each write (capacity came
        # free); without it (shutdown), each delivered outcome does.
        self._wake_on_deliver = True
        self._masks: tuple[str | None, ...] | None = None
        self._counts: dict[str, list[int]] = {}
        self._counts_lock = threading.Lock()
        self._rotation = 0
        self._hungry: dict[str, bool] = {}
        # Whether the next claim should read partitions and concurrency keys
        # (claim_batch) rather than plain jobs alone (claim_batch_plain). Set by a claim
        # that left some open, a flow notification (a key's slot came free elsewhere),
        # an outcome of ours that freed a partition or slot, and at least once per poll
        # interval (_wants_flow); so a plain drain never reads flow-control state.
        self._flow_open = True
        self._flow_claimed_at = -float("inf")
        # An operator cancelled attempts not started yet: the dispatcher gives them back.
        self._cancels_to_hand_back = False
        # Jobs whose unknown task was already reported (a WARNING once per job per worker).
        self._unknown_reported: dict[int, None] = {}
        self._claim_sent_at = time.monotonic()
        self._adaptive = AdaptivePrefetch(
            options.prefetch_window, options.batch_size, options.concurrency
        )
        self._next_hand_back_check = 0.0
        self._retry_policy = RetryPolicy.from_settings()
        self._slot = ConnectionSlot(options.database, f"pgqueue dispatcher {self.id}")
        self._recorder_slot = ConnectionSlot(options.database, f"pgqueue recorder {self.id}")
        self._control = ConnectionSlot(options.database, f"pgqueue heartbeat {self.id}")
        # Step writes of async tasks: never on the heartbeat's connection, so a step
        # write cannot delay a lease extension, nor wait for one.
        self._steps = ConnectionSlot(options.database, f"pgqueue steps {self.id}")
        self._resolver = TaskResolver()
        self._tally = OutcomeTally(self.id, options.log_summary_seconds)
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
        self._scheduler: Scheduler | None = None
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
            crashed = True
            try:
                self._loop()
                crashed = False
            finally:
                self._shutdown(crashed=crashed)
        self._tally.log()
        logger.info("worker %s stopped after %d jobs", self.id, self.processed)
        return 0

    def request_stop(self) -> None:
        """Begin a graceful shutdown; a second call makes it immediate.

        Thread-safe, but not for a signal handler: it sets an event the main thread
        waits on (SIGTERM and SIGINT reach it through a :class:`SignalRelay`)."""
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
        with SignalRelay(lambda signum: self.request_stop(), name=f"pgqueue signals {self.id}"):
            yield

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
            lease_channel=lease_channel(),
            on_lease_notice=self._lease_notice,
            flow_channel=flow_channel(),
            on_flow=self._flow_hint,
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
            on_leases_extended=self._leases_extended,
            take_counts=self._take_counts,
            set_masks=self._set_masks,
            status=lambda: str(self.status),
            metadata=self._metadata(),
            overdue=self._overdue_jobs,
            on_cancel_requested=self._cancel_requested,
        )
        self._listener.start()
        self._heartbeat.start()
        self._recorder = threading.Thread(
            target=self._record_forever, name=f"pgqueue recorder {self.id}", daemon=True
        )
        self._wake_on_deliver = False
        self._recorder.start()
        if options.housekeeping:
            self._housekeeper = Housekeeper(
                alias=options.database,
                interval=options.housekeeping_interval,
                worker_timeout=options.worker_timeout,
                name=f"pgqueue housekeeping {self.id}",
            )
            self._housekeeper.start()
        if options.schedules:
            self._scheduler = Scheduler(alias=options.database, name=f"pgqueue scheduler {self.id}")
            self._scheduler.start()

    # ------------------------------------------------------------------ the loop
    def _loop(self) -> None:
        options = self.options
        while not self._stop_requests:
            self._wake.clear()
            if self._recorder_error is not None:
                raise self._recorder_error
            self._tally.log_if_due()
            self._enforce_deadlines()
            self._hand_back_cancelled()
            if self._adaptive.enabled:
                self._hand_back_stale()
            total_slots = options.concurrency + options.prefetch + self._adaptive.extra()
            refill_at = max(1, total_slots // 2)
            if options.max_jobs is not None and self.processed >= options.max_jobs:
                return
            with self._flights_lock:
                held = len(self._flights)
                waiting = finished = 0
                for flight in self._flights.values():
                    if flight.started_at is None:
                        waiting += 1
                    elif not flight.busy:
                        finished += 1
            # Up to a batch of attempts whose outcome waits for the recorder takes no
            # slot: the next claim goes out while the last batch is written, rather
            # than claim, run, write, claim in turn (a third of a drain spent waiting).
            capacity = total_slots - held + min(finished, options.batch_size)
            if options.max_jobs is not None:
                capacity = min(capacity, options.max_jobs - self.processed - held)
            if capacity > 0 and (capacity >= refill_at or waiting == 0):
                try:
                    claimed, full = self._claim(min(capacity, options.batch_size))
                except CONNECTION_ERRORS as error:
                    logger.warning("claim failed, the connection was lost (%s)", error)
                    self._wake.wait(0.2)
                    continue
                except TRANSIENT_ERRORS as error:
                    logger.warning("claim failed (%s); retrying", error)
                    self._wake.wait(0.05)
                    continue
                coroutines: list[InFlight] = []
                for job in claimed:
                    self._dispatch(job, coroutines)
                self._async.submit_many(coroutines)
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
                f.deadline
                for f in self._flights.values()
                if f.deadline and not f.abandoned and not f.overdue
            ]
            if self._adaptive.enabled:
                # Wake up in time to hand back a job that waits too long for a thread.
                deadlines.extend(
                    max(f.claimed_at + self._adaptive.hold_seconds, self._next_hand_back_check)
                    for f in self._flights.values()
                    if f.started_at is None and not f.abandoned
                )
        if deadlines:
            timeout = min(timeout, max(0.0, min(deadlines) - now) + 0.001)
        return timeout

    def _hand_back_stale(self) -> None:
        """Give back jobs that waited for a thread longer than adaptive prefetch allows.

        Adaptive prefetch holds what the measured rate says will start within a few
        milliseconds. When the jobs running now turn slow, the jobs held behind them would
        wait for as long as those take, while other workers may be idle: past
        ``hold_seconds`` they go back to the queue (fenced, attempt refunded), keeping the
        oldest ``--prefetch`` ones, which the operator asked this worker to hold.
        """
        now = time.monotonic()
        if now < self._next_hand_back_check:
            return  # holds are a second or more: ten looks a second are plenty
        self._next_hand_back_check = now + 0.1
        cutoff = now - self._adaptive.hold_seconds
        with self._flights_lock:
            waiting = sorted(
                (f for f in self._flights.values() if f.started_at is None and not f.abandoned),
                key=lambda f: f.claimed_at,
            )
        stale = [f for f in waiting[self.options.prefetch :] if f.claimed_at <= cutoff]
        if stale:
            self._release(
                stale,
                f"waited over {self._adaptive.hold_seconds:g}s for a free slot in worker "
                f"{self.id} (its running jobs are slow); handed back for another worker",
                withdraw=True,
            )

    def _claim(self, limit: int) -> tuple[list[ClaimedJob], bool]:
        """Claim up to ``limit`` jobs shared fairly between the queues; return them and
        whether claiming again at once is worthwhile (a queue filled its share, or the
        claim stopped at its total while jobs may remain)."""
        queues, masks, limits = self._shares(limit)
        # Taken before the claim is sent: the database's lease starts no earlier.
        self._claim_sent_at = time.monotonic()
        sent_at = time.perf_counter()
        flow = self._wants_flow()
        if flow:
            # Cleared before the claim is sent: a hint arriving meanwhile is kept.
            self._flow_open = False
            self._flow_claimed_at = self._claim_sent_at
        round_ = self._slot.run(
            lambda store: store.claim_round(
                self.id,
                queues,
                per_queue=limits,
                lease_seconds=self.options.lease_seconds,
                bucket_masks=masks,
                total_limit=limit,
                plain=not flow,
            )
        )
        if round_.flow_open or round_.more_signals:
            self._flow_open = True
        claimed = round_.jobs
        observe.current.claimed(len(claimed), time.perf_counter() - sent_at)
        got: dict[str, int] = dict.fromkeys(queues, 0)
        for job in claimed:
            got[job.queue] += 1
        full = len(claimed) >= limit or round_.more_signals
        for queue, share in zip(queues, limits, strict=True):
            self._hungry[queue] = got[queue] >= share
            full = full or self._hungry[queue]
        if claimed:
            self._note_waits(claimed)
        return claimed, full

    def _wants_flow(self) -> bool:
        """Return whether the next claim should read partitions and concurrency keys."""
        return (
            self._flow_open
            or time.monotonic() - self._flow_claimed_at >= self.options.poll_interval
        )

    def _flow_hint(self) -> None:
        """The listener heard that a key can start a job again (or reconnected)."""
        self._flow_open = True

    def _shares(
        self, limit: int
    ) -> tuple[tuple[str, ...], tuple[str | None, ...] | None, list[int]]:
        """Split ``limit`` between the queues, every queue getting at least one slot.

        Every queue is looked at in every claim: the claim's total is capped at
        ``limit``, and the queue order rotates, so with fewer slots than queues the
        queues take turns at the ties without any being skipped. With more slots, queues
        whose last share came back full ("hungry") split the capacity equally; the
        others get one slot each, enough to notice new work, after which they count as
        hungry too.
        """
        queues = list(self.options.queues)
        masks = list(self._masks) if self._masks else None
        start = self._rotation % len(queues)
        self._rotation += 1
        order = [(start + offset) % len(queues) for offset in range(len(queues))]
        queues = [queues[index] for index in order]
        if masks is not None:
            masks = [masks[index] for index in order]
        if limit <= len(queues):
            return tuple(queues), tuple(masks) if masks else None, [1] * len(queues)
        hungry = [queue for queue in queues if self._hungry.get(queue, True)]
        if not hungry:
            hungry = list(queues)
        idle = len(queues) - len(hungry)
        share, extra = divmod(limit - idle, len(hungry))
        # The remainder goes to the first hungry queues of this round's order.
        bonus = set(hungry[:extra])
        limits = [share + (queue in bonus) if queue in hungry else 1 for queue in queues]
        return tuple(queues), tuple(masks) if masks else None, limits

    def _dispatch(self, job: ClaimedJob, coroutines: list[InFlight]) -> None:
        """Hand ``job`` to a thread, or add it to ``coroutines`` (started together)."""
        try:
            entry = self._resolver.resolve(job.task_path)
        except UnknownTask as error:
            flight = InFlight(job, None)
            with self._flights_lock:
                self._flights[flight.key] = flight
            self._deliver(self._unknown_task_outcome(flight, error))
            return
        flight = InFlight(
            job, entry, lease_valid_until=self._claim_sent_at + self.options.lease_seconds
        )
        with self._flights_lock:
            self._flights[flight.key] = flight
        observe.current.job_started(job)
        if job_logger.isEnabledFor(logging.DEBUG):
            job_logger.debug(
                "job %s started: task=%s queue=%s attempt=%d/%d",
                job.id,
                job.task_path,
                job.queue,
                job.attempts,
                job.max_attempts,
                extra=job_extra(job),
            )
        if entry.is_async:
            coroutines.append(flight)
        else:
            assert self._pool is not None
            self._pool.submit(flight)

    def _unknown_task_outcome(self, flight: InFlight, error: UnknownTask) -> Outcome:
        """Wait for a worker that knows the task (a rolling deploy), or give up.

        The window starts when the job was first ready and found unknown (kept on the
        row across releases), not when it was created: a job scheduled hours ahead is
        not dead-lettered the moment it becomes ready.
        """
        job = flight.job
        since = job.unknown_task_since or job.available_at
        waited = max(0.0, (job.claimed_at - since).total_seconds())
        window = conf.UNKNOWN_TASK_TIMEOUT_SECONDS
        if waited >= window:
            failure = Failure(
                exception_class="django_pgqueue.exceptions.UnknownTask",
                message=f"unknown task: no worker could import {job.task_path!r} within "
                f"{window:.0f}s ({error.reason})",
                permanent=True,
            )
            return Outcome(flight, OutcomeKind.FAILED, failure=failure)
        if job.id not in self._unknown_reported:
            self._unknown_reported[job.id] = None
            while len(self._unknown_reported) > 10_000:  # bounded: forget the oldest
                del self._unknown_reported[next(iter(self._unknown_reported))]
            logger.warning(
                "job %s: this worker cannot import task %r (%s). The job waits, without "
                "using an attempt, for a worker that knows the task: deploy the code that "
                "defines it and restart the workers. It is dead-lettered if none does "
                "within %.0fs of when it became ready (UNKNOWN_TASK_TIMEOUT_SECONDS).",
                job.id,
                job.task_path,
                error.reason,
                window,
                extra=job_extra(job),
            )
        # Back off from 1 to 60 seconds without burning an attempt.
        delay = min(60.0, max(1.0, waited / 4))
        reason = (
            f"waiting for a worker that knows this task: {job.task_path!r} could not be "
            f"imported by worker {self.id} ({error.reason}); retrying in {delay:.0f}s"
        )
        return Outcome(
            flight,
            OutcomeKind.RELEASE,
            delay=delay,
            reason=reason,
            reason_class=f"{UnknownTask.__module__}.{UnknownTask.__qualname__}",
            unknown_since=since,
        )

    def _deliver(self, outcome: Outcome) -> None:
        outcome.flight.busy = False
        self._outcomes.put(outcome)
        if self._wake_on_deliver:
            self._wake.set()

    # ------------------------------------------------------------------ recording
    def _record_forever(self) -> None:
        """The recorder thread: write outcomes as they arrive, in batches.

        Outcomes that arrive while a write is under way go in the next one, so the batch
        grows with the rate. An error that is not the database's (a bug) stops the
        worker as it would have in the dispatcher: the dispatcher re-raises it.
        """
        try:
            while not self._recorder_stop.is_set():
                first = None
                if not self._undelivered:
                    try:
                        first = self._outcomes.get(timeout=0.1)
                    except Empty:
                        continue
                # Finished attempts take no slot while they are written (see _loop): the
                # dispatcher may claim the next batch during this write.
                self._wake.set()
                with self._record_lock:
                    if first is not None:
                        self._undelivered.append(first)  # before those queued behind it
                    recorded = self._record_outcomes()
                self._wake.set()  # capacity came free: the dispatcher may claim
                if not recorded:
                    self._recorder_stop.wait(0.2)  # the database is unreachable: retry soon
        except BaseException as error:
            logger.exception("worker %s: the recorder failed", self.id)
            self._recorder_error = error
            self._wake.set()

    def _stop_recorder(self) -> None:
        """Stop the recorder thread after its current write; outcomes then wake the loop."""
        self._wake_on_deliver = True
        self._recorder_stop.set()
        if self._recorder is not None:
            # A write to a server that stopped answering ends at the connection's
            # timeouts; until then, _record_lock keeps the dispatcher's writes apart.
            self._recorder.join(self.options.grace_seconds)

    def _record_outcomes(self) -> bool:
        """Write every delivered outcome; return False if the database was unreachable.

        Recording never crashes the worker: an outcome the database refuses is written
        on its own, made storable, and as a last resort recorded as a failure of that
        job alone (see _write_one). Call with ``_record_lock`` held.
        """
        outcomes = self._undelivered
        self._undelivered = []
        while True:
            try:
                outcomes.append(self._outcomes.get_nowait())
            except Empty:
                break
        if not outcomes:
            return True
        self._adaptive.finished(len(outcomes), run_times=[outcome.duration for outcome in outcomes])
        for outcome in outcomes:
            self._settle_timeout(outcome)
        self._write_started = time.monotonic()
        try:
            self._recorder_slot.run(lambda store: self._write_outcomes(store, outcomes))
        except CONNECTION_ERRORS as error:
            logger.warning("recording %d outcomes failed (%s); will retry", len(outcomes), error)
            self._undelivered = [outcome for outcome in outcomes if not outcome.written]
            return False
        except TRANSIENT_ERRORS as error:
            logger.warning("recording %d outcomes failed (%s); will retry", len(outcomes), error)
            self._undelivered = [outcome for outcome in outcomes if not outcome.written]
        finally:
            self._write_started = None
        return True

    def _settle_timeout(self, outcome: Outcome) -> None:
        """Turn the late outcome of a handler that outlived its timeout into JobTimeout."""
        flight = outcome.flight
        if not flight.overdue or flight.abandoned:
            return
        if outcome.kind not in (OutcomeKind.SUCCEEDED, OutcomeKind.FAILED):
            return
        assert flight.entry is not None
        outcome.kind = OutcomeKind.FAILED
        outcome.failure = Failure(
            exception_class=f"{JobTimeout.__module__}.{JobTimeout.__qualname__}",
            message=f"{flight.job.task_path} ran longer than its timeout of "
            f"{flight.entry.timeout}s (it returned after {outcome.duration:.1f}s; its "
            "result was discarded)",
        )

    def _write_outcomes(self, store: Any, outcomes: list[Outcome]) -> None:
        pending = [o for o in outcomes if not o.written]
        successes = [
            o for o in pending if o.kind is OutcomeKind.SUCCEEDED and not o.flight.abandoned
        ]
        if successes:
            try:
                done = store.complete_many_outcomes(
                    self.id, [(o.flight.job.lease, o.result_json) for o in successes]
                )
            except CONNECTION_ERRORS + TRANSIENT_ERRORS:
                raise
            except psycopg.Error as error:
                # One result the database refuses must not fail the others: write each
                # on its own (below).
                logger.warning("recording %d results together failed (%s)", len(successes), error)
            else:
                for outcome in successes:
                    self._finish(outcome, _completion_label(done.get(outcome.flight.job.id)))
        for outcome in pending:
            if outcome.written:
                continue
            self._write_one(store, outcome)

    def _write_one(self, store: Any, outcome: Outcome) -> None:
        flight = outcome.flight
        try:
            if outcome.kind is OutcomeKind.COMMITTED:
                # The atomic task completed the job in its own transaction: that is what
                # the database recorded, whatever happened to the lease since.
                self._finish(outcome, "succeeded")
            elif flight.abandoned or outcome.kind is OutcomeKind.LOST:
                self._finish(outcome, "abandoned" if flight.abandoned else "lease lost")
            elif outcome.kind is OutcomeKind.SUCCEEDED:
                self._complete_one(store, outcome)
            elif outcome.kind is OutcomeKind.FAILED:
                self._fail_one(store, outcome)
            elif outcome.kind is OutcomeKind.RELEASE:
                try:
                    store.release_if_leased(
                        flight.job.lease,
                        delay_seconds=outcome.delay,
                        reason=storable_text(outcome.reason or "", 10_000) or None,
                        reason_class=outcome.reason_class,
                        unknown_since=outcome.unknown_since,
                    )
                    label = "cancelled" if flight.cancel_requested else "released"
                except LeaseLost:
                    label = "release refused (lease lost)"
                self._finish(outcome, label)
        except CONNECTION_ERRORS + TRANSIENT_ERRORS:
            raise
        except psycopg.Error:
            logger.exception(
                "job %s: its outcome could not be recorded; its lease will expire and it "
                "will be retried",
                flight.job.id,
                extra=job_extra(flight.job),
            )
            self._finish(outcome, "not recorded")

    def _complete_one(self, store: Any, outcome: Outcome) -> None:
        lease = outcome.flight.job.lease
        try:
            done = store.complete_many_outcomes(self.id, [(lease, outcome.result_json)])
        except CONNECTION_ERRORS + TRANSIENT_ERRORS:
            raise
        except psycopg.Error as error:
            # The work is done: a retry would do it twice. Keep the success, not the value.
            logger.warning(
                "job %s: its result could not be stored (%s); recording the success with a "
                "note instead of the result",
                lease.job_id,
                type(error).__name__,
                extra=job_extra(outcome.flight.job),
            )
            note = json.dumps(
                {
                    "django_pgqueue": "result not stored",
                    "reason": storable_text(str(error).splitlines()[0] if str(error) else "", 500),
                }
            )
            done = store.complete_many_outcomes(self.id, [(lease, note)])
        self._finish(outcome, _completion_label(done.get(lease.job_id)))

    def _fail_one(self, store: Any, outcome: Outcome) -> None:
        assert outcome.failure is not None
        lease = outcome.flight.job.lease
        failure = storable_failure(outcome.failure)
        outcome.failure = failure
        try:
            try:
                result = store.fail_if_leased(lease, failure, self._retry_policy)
            except CONNECTION_ERRORS + TRANSIENT_ERRORS:
                raise
            except psycopg.Error as error:
                logger.warning(
                    "job %s: its failure could not be stored as raised (%s); recording a "
                    "plain failure",
                    lease.job_id,
                    type(error).__name__,
                    extra=job_extra(outcome.flight.job),
                )
                plain = Failure(
                    exception_class=storable_text(failure.exception_class, 255),
                    message="the error could not be stored "
                    f"({type(error).__name__}); see the worker's log",
                    permanent=failure.permanent,
                )
                result = store.fail_if_leased(lease, plain, self._retry_policy)
            label = _FAILURE_LABELS.get(result.status, "failed, will retry")
        except LeaseLost:
            label = "failed (lease lost)"
        self._finish(outcome, label)

    def _finish(self, outcome: Outcome, label: str) -> None:
        outcome.written = True
        flight = outcome.flight
        job = flight.job
        with self._flights_lock:
            # Only this attempt's entry: a newer attempt of the same job is left alone.
            if self._flights.get(flight.key) is flight:
                del self._flights[flight.key]
        # --max-jobs counts executed attempts: a job handed back unstarted (its task
        # unknown here, or at shutdown) or lost before it started ran nothing.
        if flight.started_at is not None or outcome.kind not in _NOT_RUN:
            self.processed += 1
        if job.partition_key is not None or job.concurrency_key is not None:
            # A partition turn or a slot came free: the next claim reads them.
            self._flow_open = True
        self._count(job.queue, label)
        self._tally.add(label)
        observe.current.job_finished(job, label, outcome.duration)
        failure = outcome.failure if label != "succeeded" else None
        if outcome.unknown_since is not None:
            # Its WARNING (once per job) said it all; a line per release would repeat it
            # every few seconds until the task is deployed.
            job_logger.debug("job %s %s: unknown task", job.id, label, extra=job_extra(job))
            return
        # A success is a DEBUG line (-v 2): the summary line counts them at -v 1 (see
        # tally.py). Anything else that ends an attempt is worth a line of its own.
        level = (
            logging.WARNING if failure else logging.DEBUG if label == "succeeded" else logging.INFO
        )
        if job_logger.isEnabledFor(level):
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
                job_logger.log(
                    level,
                    message,
                    *args,
                    extra=job_extra(job, outcome=label, duration=outcome.duration),
                )
            elif label == "dead-lettered" and failure.traceback:
                # The traceback once, where someone will look: retries get one line each.
                job_logger.error(
                    message + " error=%s: %s\n%s",
                    *args,
                    failure.exception_class,
                    failure.message,
                    failure.traceback.rstrip(),
                    extra=job_extra(job, outcome=label, duration=outcome.duration),
                )
            else:
                job_logger.warning(
                    message + " error=%s: %s",
                    *args,
                    failure.exception_class,
                    failure.message,
                    extra=job_extra(job, outcome=label, duration=outcome.duration),
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
            return [
                flight.job.lease
                for flight in self._flights.values()
                if not flight.abandoned and not flight.committed
            ]

    def _overdue_jobs(self) -> list[int]:
        with self._flights_lock:
            return sorted(
                flight.job.id
                for flight in self._flights.values()
                if flight.overdue and flight.busy and not flight.abandoned
            )

    def _leases_extended(self, held: frozenset[tuple[int, int]], sent_at: float) -> None:
        until = sent_at + self.options.lease_seconds
        with self._flights_lock:
            for key in held:
                flight = self._flights.get(key)
                if flight is not None:
                    flight.lease_valid_until = until

    def _lease_notice(self, payload: str) -> None:
        """Act on a lease notice from the listener: stop an attempt this worker lost."""
        notice = parse_notice(payload)
        if notice is None or notice.worker_id != self.id:
            return
        # By (job id, generation): a notice about an older attempt of a job this worker
        # has since claimed again matches no flight.
        lease = Lease(notice.job_id, notice.lease_generation, self.id)
        if notice.reason == "cancelled":
            self._cancel_requested([lease])
            return
        why = {"reaped": "its lease expired and was recovered"}.get(notice.reason, notice.reason)
        self._leases_lost([lease], why=why)

    def _cancel_requested(self, leases: list[Lease]) -> None:
        """Stop the handlers of attempts an operator cancelled; they keep their leases.

        The job stays processing (its slot and partition turn held, its lease extended)
        until the handler returns: whatever it returns is then recorded as cancelled. A
        handler that has not started is not started: the job is given back, which
        records it cancelled. Learned once per attempt (the notice and the heartbeat may
        both report it).
        """
        with self._flights_lock:
            flights = [
                flight
                for lease in leases
                if (flight := self._flights.get((lease.job_id, lease.lease_generation))) is not None
                and not flight.cancel_requested
                and not flight.abandoned
                and not flight.committed
            ]
            for flight in flights:
                flight.cancel_requested = True
        for flight in flights:
            logger.warning(
                "job %s: cancelled by an operator while it ran; asked its handler to stop. "
                "It keeps its lease, slot and partition until the handler returns, and "
                "then ends cancelled",
                flight.job.id,
                extra=job_extra(flight.job),
            )
            flight.cancel.set()
            if flight.entry is not None and flight.entry.is_async:
                self._async.cancel(flight)
        if flights:
            self._cancels_to_hand_back = True
            self._wake.set()  # the dispatcher gives back those not started (below)

    def _hand_back_cancelled(self) -> None:
        """Give back the cancelled attempts whose handlers have not started (recorded
        cancelled); on the dispatcher's thread, which owns the connection it uses."""
        if not self._cancels_to_hand_back:
            return
        self._cancels_to_hand_back = False
        with self._flights_lock:
            waiting = [
                flight
                for flight in self._flights.values()
                if flight.cancel_requested and flight.started_at is None and not flight.abandoned
            ]
        self._release(waiting, "cancelled by an operator before it started", withdraw=True)

    def _leases_lost(self, leases: list[Lease], *, why: str = "not held any more") -> None:
        with self._flights_lock:
            lost = [
                flight
                for lease in leases
                if (flight := self._flights.get((lease.job_id, lease.lease_generation))) is not None
                # An atomic task that committed (or is committing) finished its job: the
                # heartbeat may read the row finished before the flag says so.
                and not flight.committed
                and not flight.committing
                # Its handler returned: the outcome's own fenced write tells whether the
                # lease still held. A lease "lost" here may just be the recorder's
                # completion, committed a moment before this worker's flights caught up.
                and flight.busy
                # Learned once: the notice and the heartbeat may both report it.
                and not flight.abandoned
            ]
        observe.current.leases_lost(len(lost))
        for flight in lost:
            logger.warning(
                "job %s: lease lost (generation %d): %s; abandoning it, dropping its result",
                flight.job.id,
                flight.job.lease_generation,
                why,
                extra=job_extra(flight.job),
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
        # Async tasks only (sync ones write through their own thread's connection).
        self._steps.run(lambda store: store.set_step_if_leased(job.lease, step))

    def _enforce_deadlines(self) -> None:
        """Ask sync handlers past their timeout to stop; they keep their lease meanwhile.

        Python cannot stop a thread. Failing the job now would let another attempt (or
        the next job of its partition) start while this one still runs, so the attempt
        keeps its lease, slot and partition until its handler returns, and is then
        recorded as a JobTimeout failure (see _settle_timeout). Cooperative handlers see
        ``context.cancelled``. The worker's registry row lists it (the admin shows it).
        """
        now = time.monotonic()
        with self._flights_lock:
            overdue = [
                flight
                for flight in self._flights.values()
                if flight.deadline is not None
                and flight.deadline <= now
                and not flight.abandoned
                and not flight.overdue
                and flight.busy
                and flight.entry is not None
                and not flight.entry.is_async  # async tasks time out with wait_for
            ]
        for flight in overdue:
            assert flight.entry is not None
            flight.overdue = True
            flight.cancel.set()
            logger.warning(
                "job %s: ran past its timeout of %ss; asked it to stop. Its thread is still "
                "running: the job keeps its lease, slot and partition until it returns, "
                "and then fails with JobTimeout",
                flight.job.id,
                flight.entry.timeout,
                extra=job_extra(flight.job),
            )

    # ------------------------------------------------------------------ shutdown
    def _shutdown(self, *, crashed: bool = False) -> None:
        """Finish or give back what this worker holds.

        Jobs not started yet are released with their attempt refunded. An outcome whose
        handler returned is written, never released: releasing would run the job again.
        After a graceful stop, jobs still running when the grace period ends are released
        (refunded: the operator interrupted them). After a crash (an error escaped the
        loop) they are left to expire, so their attempt stays counted and a job that
        crashes its worker every time still reaches dead_letter within max_attempts.
        """
        grace_ends = time.monotonic() + self.options.grace_seconds
        # A write stuck on a row lock must not hold the shutdown past the grace period.
        watchdog = OverdueWriteWatchdog(
            grace_ends=grace_ends,
            write_started=lambda: self._write_started,
            cancel=self._recorder_slot.cancel_statement,
            stop_now=lambda: self._stop_requests >= 2,
        )
        with watchdog:
            self._finish_or_give_back(grace_ends, crashed=crashed)
        for component in (self._listener, self._heartbeat, self._housekeeper, self._scheduler):
            if component is not None:
                component.stop()
        if self._heartbeat is not None:
            self._heartbeat.join(5)
        self._set_registry_status(WorkerStatus.DEAD)
        if self._pool is not None:
            self._pool.shutdown()
        self._async.shutdown()
        for component in (self._listener, self._housekeeper, self._scheduler):
            if component is not None:
                component.join(1)
        self._slot.close()
        self._recorder_slot.close()
        self._control.close()
        self._steps.close()

    def _finish_or_give_back(self, grace_ends: float, *, crashed: bool) -> None:
        """Record what finished, give back what did not (see _shutdown)."""
        self._stop_recorder()
        self.status = WorkerStatus.DRAINING
        self._set_registry_status(WorkerStatus.DRAINING)
        with self._flights_lock:
            waiting = [
                f for f in self._flights.values() if f.started_at is None and not f.abandoned
            ]
        self._release(waiting, "worker shutting down before the job started", withdraw=True)
        # Running jobs get the grace period, unless a second signal arrives.
        while not crashed and self._stop_requests < 2:
            self._record_outcomes_at_exit()
            with self._flights_lock:
                running = [f for f in self._flights.values() if f.busy and not f.abandoned]
            if not running or time.monotonic() >= grace_ends:
                break
            self._wake.wait(min(0.1, max(0.0, grace_ends - time.monotonic())))
            self._wake.clear()
        self._record_outcomes_at_exit()
        with self._flights_lock:
            remaining = [f for f in self._flights.values() if not f.abandoned]
        returned = [f for f in remaining if not f.busy]
        running = [f for f in remaining if f.busy]
        if returned:
            logger.warning(
                "worker %s: the outcomes of %d finished jobs could not be recorded; they "
                "come back when their leases expire (their attempts stay counted)",
                self.id,
                len(returned),
            )
        if running and crashed:
            logger.warning(
                "worker %s: leaving %d running jobs to their leases after a crash",
                self.id,
                len(running),
            )
        elif running:
            logger.warning(
                "worker %s: releasing %d unfinished jobs at shutdown", self.id, len(running)
            )
            self._release(running, "worker shut down before the job finished")

    def _record_outcomes_at_exit(self) -> None:
        try:
            with self._record_lock:
                self._record_outcomes()
        except Exception:
            logger.exception("worker %s: recording outcomes at shutdown failed", self.id)

    def _release(self, flights: list[InFlight], reason: str, *, withdraw: bool = False) -> None:
        """Give ``flights`` back to the queue (fenced, attempt refunded).

        With ``withdraw``, only the attempts whose handler has not started are given back:
        a thread may take one between the caller's look and this call.
        """
        if withdraw:
            flights = [flight for flight in flights if flight.withdraw()]
        if not flights:
            return
        for flight in flights:
            self._abandon(flight)
        leases = [flight.job.lease for flight in flights]
        try:
            released = self._slot.run(
                lambda store: store.release_many_if_leased(self.id, leases, reason=reason)
            )
        except psycopg.Error as error:
            # Whatever the database answered (a lost connection, or a statement it
            # refused): the jobs come back through the reaper; the worker goes on.
            logger.warning(
                "could not release %d jobs (%s); they come back when their leases expire",
                len(leases),
                error,
            )
            return
        with self._flights_lock:
            for flight in flights:
                if not flight.busy and self._flights.get(flight.key) is flight:
                    del self._flights[flight.key]
        logger.info("released %d of %d jobs: %s", len(released), len(leases), reason)

    def _set_registry_status(self, status: WorkerStatus) -> None:
        try:
            self._control.run(lambda store: store.set_worker_status(self.id, status))
        except CONNECTION_ERRORS as error:
            logger.warning("could not mark worker %s %s (%s)", self.id, status, error)


_FAILURE_LABELS = {
    JobStatus.DEAD_LETTER: "dead-lettered",
    JobStatus.CANCELLED: "cancelled",
}


def _completion_label(status: JobStatus | None) -> str:
    """Return how a completion ended: succeeded, cancelled (while it ran), or lease lost."""
    if status is None:
        return "lease lost"
    return "cancelled" if status is JobStatus.CANCELLED else "succeeded"
