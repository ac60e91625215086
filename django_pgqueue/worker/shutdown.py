"""Shutdown: finish or give back every attempt, write every outcome, leave the registry."""

from __future__ import annotations

import logging
import time

from django_pgqueue.states import WorkerStatus
from django_pgqueue.worker.connection import CONNECTION_ERRORS
from django_pgqueue.worker.exitwatch import OverdueWriteWatchdog
from django_pgqueue.worker.leases import LeaseKeeper

__all__ = ["GracefulShutdown"]

logger = logging.getLogger("django_pgqueue.worker")


class GracefulShutdown(LeaseKeeper):
    """Stops cleanly: finish what runs within the grace period, give back the rest."""

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
        self._batcher.slot.close()

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
            if self._replacing:
                # Their threads end with this process, not before: a release now could
                # start another attempt beside a handler still running. Their leases,
                # extended until now, run out once the process is gone.
                stuck = [f for f in running if f.stuck_since is not None]
                running = [f for f in running if f.stuck_since is None]
                if stuck:
                    logger.warning(
                        "worker %s: leaving %d stuck jobs to their leases (%s); they are "
                        "retried once the leases run out, after this process has exited",
                        self.id,
                        len(stuck),
                        ", ".join(str(f.job.id) for f in stuck),
                    )
            if running:
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

    def _set_registry_status(self, status: WorkerStatus) -> None:
        try:
            self._control.run(lambda store: store.set_worker_status(self.id, status))
        except CONNECTION_ERRORS as error:
            logger.warning("could not mark worker %s %s (%s)", self.id, status, error)
