"""Lease keeping: what a worker does when a lease is extended, lost, cancelled or overdue."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import psycopg

from django_pgqueue.store.notices import parse_notice
from django_pgqueue.store.values import Lease
from django_pgqueue.worker import observe
from django_pgqueue.worker.flight import InFlight
from django_pgqueue.worker.logfields import job_extra
from django_pgqueue.worker.recording import OutcomeRecorder

__all__ = ["EXIT_STUCK", "LeaseKeeper"]

#: The exit code of a worker process that stopped to be replaced: a handler was stuck.
EXIT_STUCK = 3

logger = logging.getLogger("django_pgqueue.worker")


class LeaseKeeper(OutcomeRecorder):
    """Extends, checks and gives up leases: notices, cancels, deadlines."""

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

    def _stuck_handlers(self) -> list[dict[str, Any]]:
        """Describe the handlers still running after being asked to stop (the registry's).

        ``seconds``: how long since they were asked (their timeout passed, or an operator
        cancelled them), as of this call; ``why``: "timeout" or "cancel".
        """
        now = time.monotonic()
        with self._flights_lock:
            # Called on every turn of the loop: a pass over the flights, nothing sorted
            # or built unless one is stuck.
            stuck = [
                flight
                for flight in self._flights.values()
                if flight.stuck_since is not None and flight.busy and not flight.abandoned
            ]
        return [
            {
                "job": flight.job.id,
                "task": flight.job.task_path,
                "seconds": round(now - (flight.stuck_since or now), 1),
                "why": "timeout" if flight.overdue else "cancel",
            }
            for flight in sorted(stuck, key=lambda f: f.job.id)
        ]

    def _replace_if_stuck(self) -> None:
        """Stop this process cleanly once a handler has been stuck past the grace.

        Python cannot stop the thread; ending the process can. The worker drains as on
        SIGTERM, leaves the stuck jobs to their leases (they are held, and extended, until
        the process has exited with the thread) and exits with :data:`EXIT_STUCK`; the
        supervisor (``--processes``) or the process manager starts a fresh one.
        """
        grace = self._stuck_grace
        if grace is None or self._replacing or not self._stuck_marked:
            return
        handlers = self._stuck_handlers()
        if not handlers:
            with self._flights_lock:
                # Under the lock a cancel marks flights with: none can be missed.
                if not any(
                    f.stuck_since is not None and f.busy and not f.abandoned
                    for f in self._flights.values()
                ):
                    self._stuck_marked = False  # they all returned: back to the free check
            return
        stuck = [h for h in handlers if h["seconds"] >= grace]
        if not stuck:
            return
        self._replacing = True
        for handler in stuck:
            logger.error(
                "job %s: its handler (%s) is still running %ss after it was asked to stop "
                "(%s); replacing worker process %s (PGQUEUE_STUCK_HANDLER_GRACE_SECONDS=%s). "
                "The job keeps its lease until this process has exited",
                handler["job"],
                handler["task"],
                handler["seconds"],
                "its timeout passed" if handler["why"] == "timeout" else "cancelled",
                os.getpid(),
                grace,
            )
        # As a SIGTERM would: the loop stops claiming and the shutdown drains.
        self._stop_requests += 1
        self._wake.set()

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
                if flight.started_at is not None and flight.stuck_since is None:
                    flight.stuck_since = time.monotonic()
                    self._stuck_marked = True
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
            flight.stuck_since = now
            self._stuck_marked = True
            flight.cancel.set()
            logger.warning(
                "job %s: ran past its timeout of %ss; asked it to stop. Its thread is still "
                "running: the job keeps its lease, slot and partition until it returns, "
                "and then fails with JobTimeout",
                flight.job.id,
                flight.entry.timeout,
                extra=job_extra(flight.job),
            )

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
