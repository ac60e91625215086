"""The scheduler: fires due periodic schedules from inside every worker (no extra process).

At start (before the worker claims anything) it syncs the schedule table with the code,
in one transaction under the sync lock. Then it loops: read the active schedules with
the database clock, fire those due (one autocommit statement each), sleep until the
next fire time (at most :data:`MAX_SLEEP`, so schedules added or resumed elsewhere are
noticed). Every worker runs
it and no leader is elected: two workers firing the same schedule race on its row, and
the loser's statement matches nothing (see sql/schedules.sql).
"""

from __future__ import annotations

import logging
import threading

from django_pgqueue.exceptions import InvalidSchedule
from django_pgqueue.features.periodic import declared_schedules, schedule_database
from django_pgqueue.features.scheduling import FireReport, fire_due, sync_schedules
from django_pgqueue.worker.connection import CONNECTION_ERRORS, TRANSIENT_ERRORS, ConnectionSlot

__all__ = ["MAX_SLEEP", "Scheduler", "sync_declared"]

logger = logging.getLogger("django_pgqueue.schedules")

#: Longest sleep between passes.
MAX_SLEEP = 1.0
#: Sleep after a failed pass.
RETRY_SLEEP = 1.0
#: The longest a starting worker waits for another session's schedule sync: the sync runs
#: before the worker takes jobs, and a session holding the lock without committing must
#: not keep it from them. A sync that gives up is retried by the scheduler thread.
SYNC_LOCK_TIMEOUT = 5.0


def sync_declared(slot: ConnectionSlot) -> None:
    """Write the declared schedules to the table and log what changed.

    Raises :class:`~django_pgqueue.exceptions.InvalidSchedule` for a bad declaration
    (the system checks report those before a worker starts).
    """
    schedules, problems = declared_schedules()
    if problems:
        raise InvalidSchedule("PGQUEUE_SCHEDULES", "declaration", problems[0][1])
    # Each database holds the schedules of the tasks whose jobs it stores.
    mine = [s for s in schedules.values() if schedule_database(s) in (slot.alias, None)]
    with slot.connection.transaction():
        report = sync_schedules(slot.store, mine, lock_timeout=SYNC_LOCK_TIMEOUT)
    for verb, names in (
        ("added", report.added),
        ("changed", report.changed),
        ("removed", report.removed),
    ):
        if names:
            logger.info("schedules %s: %s", verb, ", ".join(names))


class Scheduler(threading.Thread):
    """Fires due schedules until stopped (see the module docstring)."""

    def __init__(self, *, alias: str, name: str) -> None:
        super().__init__(name="pgqueue-scheduler", daemon=True)
        self._slot = ConnectionSlot(alias, name)
        self._stopping = threading.Event()
        self._synced = False
        self.passes = 0

    def stop(self) -> None:
        """Ask the thread to finish."""
        self._stopping.set()

    def start(self) -> None:
        """Sync the schedules with the code (before the worker takes jobs), then fire them
        in the thread. A sync that fails on the connection is retried by the thread."""
        self._synced = self._sync()
        super().start()

    def _sync(self) -> bool:
        try:
            sync_declared(self._slot)
        except InvalidSchedule as error:
            # manage.py check reports it too; fire what the table holds.
            logger.error("schedules not synced: %s", error)
        except CONNECTION_ERRORS + TRANSIENT_ERRORS as error:
            if not isinstance(error, TRANSIENT_ERRORS):  # a lock timeout keeps its session
                self._slot.reset()
            logger.warning("scheduler: could not sync the schedules yet (%s)", error)
            return False
        return True

    def run(self) -> None:
        """Fire due schedules until stopped (syncing first if that failed at start)."""
        delay = 0.0
        try:
            while not self._stopping.wait(delay):
                try:
                    if not self._synced:
                        self._synced = self._sync()
                    report = self._slot.run(fire_due)
                    self.passes += 1
                    delay = _sleep_after(report)
                except TRANSIENT_ERRORS as error:
                    logger.warning("scheduler: %s; retrying", error)
                    delay = RETRY_SLEEP
                except CONNECTION_ERRORS as error:
                    self._slot.reset()
                    logger.warning("scheduler: connection lost (%s)", error)
                    delay = RETRY_SLEEP
                except Exception:
                    logger.exception("scheduler pass failed")
                    delay = RETRY_SLEEP * 5
        finally:
            self._slot.close()


def _sleep_after(report: FireReport) -> float:
    if report.more:
        return 0.0
    if report.next_fire_at is None or report.database_now is None:
        return MAX_SLEEP
    wait = (report.next_fire_at - report.database_now).total_seconds()
    return min(max(wait, 0.01), MAX_SLEEP)
