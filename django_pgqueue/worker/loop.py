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

import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django_pgqueue import __version__
from django_pgqueue.conf import conf
from django_pgqueue.exceptions import ConfigurationError, UnknownTask
from django_pgqueue.store.notices import flow_channel, lease_channel
from django_pgqueue.store.values import ClaimedJob, Failure
from django_pgqueue.worker import observe
from django_pgqueue.worker.connection import CONNECTION_ERRORS, TRANSIENT_ERRORS
from django_pgqueue.worker.execution import Outcome, OutcomeKind
from django_pgqueue.worker.flight import InFlight
from django_pgqueue.worker.heartbeat import Heartbeat
from django_pgqueue.worker.housekeeping import Housekeeper
from django_pgqueue.worker.leases import EXIT_STUCK
from django_pgqueue.worker.listener import Listener
from django_pgqueue.worker.logfields import job_extra
from django_pgqueue.worker.pools import ThreadPool
from django_pgqueue.worker.scheduler import Scheduler
from django_pgqueue.worker.shutdown import GracefulShutdown
from django_pgqueue.worker.stopsignal import SignalRelay

__all__ = ["Worker"]


logger = logging.getLogger("django_pgqueue.worker")
job_logger = logging.getLogger("django_pgqueue.jobs")


class Worker(GracefulShutdown):
    """One worker process's dispatcher. ``Worker(options).run()`` blocks until it exits."""

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
        return EXIT_STUCK if self._replacing else 0

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
        self._pool = ThreadPool(options.concurrency, self._batcher.run_sync, self._deliver)
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
            stuck=self._stuck_handlers,
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
            self._replace_if_stuck()
            self._hand_back_cancelled()
            if self._adaptive.enabled:
                self._hand_back_stale()
            total_slots = options.concurrency + options.prefetch + self._adaptive.extra()
            refill_at = max(1, total_slots // 2)
            if options.max_jobs is not None and self.processed >= options.max_jobs:
                return
            with self._flights_lock:
                waiting = finished = mates = 0
                for flight in self._flights.values():
                    if flight.mate:
                        mates += 1  # runs in a batch: the batch holds one slot
                    elif flight.started_at is None:
                        waiting += 1
                    elif not flight.busy:
                        finished += 1
                held = len(self._flights) - mates
            # Up to a batch of attempts whose outcome waits for the recorder takes no
            # slot: the next claim goes out while the last batch is written, rather
            # than claim, run, write, claim in turn (a third of a drain spent waiting).
            capacity = total_slots - held + min(finished, options.batch_size)
            if options.max_jobs is not None:
                capacity = min(capacity, options.max_jobs - self.processed - held)
            if capacity > 0 and (capacity >= refill_at or waiting == 0):
                try:
                    claimed, full = self._claim(min(capacity, options.batch_size))
                except TRANSIENT_ERRORS as error:
                    logger.warning("claim failed (%s); retrying", error)
                    self._wake.wait(0.05)
                    continue
                except CONNECTION_ERRORS as error:
                    logger.warning("claim failed, the connection was lost (%s)", error)
                    self._cursor.forget()
                    self._wake.wait(0.2)
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
        floors = self._cursor.floors(queues)
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
                floors=floors.plain if floors else None,
                partition_floors=floors.partitions if floors else None,
                key_floors=floors.keys if floors else None,
            )
        )
        if round_.flow_open or round_.more_signals:
            self._flow_open = True
        claimed = round_.jobs
        seconds = time.perf_counter() - sent_at
        observe.current.claimed(len(claimed), seconds)
        got: dict[str, int] = dict.fromkeys(queues, 0)
        for job in claimed:
            got[job.queue] += 1
        full = len(claimed) >= limit or round_.more_signals
        for queue, share in zip(queues, limits, strict=True):
            self._hungry[queue] = got[queue] >= share
            full = full or self._hungry[queue]
        self._cursor.claimed(claimed, seconds=seconds, short=not full)
        if floors is None and self._slow_claims.due(seconds, self._cursor.slow_after):
            self._warn_slow_claim(seconds)
        if claimed:
            self._note_waits(claimed)
        return claimed, full

    def _warn_slow_claim(self, seconds: float) -> None:
        """Log what holds VACUUM back, after a slow claim from the head."""
        try:
            holder = self._slot.run(lambda store: store.vacuum_horizon())
        except (*CONNECTION_ERRORS, *TRANSIENT_ERRORS) as error:
            # The jobs just claimed still have to be dispatched: a diagnosis that cannot
            # be read is logged without its holder, and the next claim meets the error.
            logger.debug("could not read what holds VACUUM back (%s)", error)
            holder = None
        except Exception:
            # Whatever else goes wrong reading system views (a server or pooler that
            # refuses one of them), the same: the claim's jobs run, the warning goes
            # out without a holder, and the error is logged (at most once per warning).
            logger.warning(
                "worker %s: could not read what holds VACUUM back", self.id, exc_info=True
            )
            holder = None
        self._slow_claims.warn(self.id, seconds, holder)

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
