"""Housekeeping: recover expired leases, mark silent workers dead, prune old rows.

Every worker runs the loop; in each pass only the one that takes the transaction-level
advisory lock does the work, so exactly one worker at a time does it, also behind
PgBouncer in transaction mode (the lock dies with the transaction).
"""

from __future__ import annotations

import logging
import random
import threading
from dataclasses import dataclass

from ..conf import conf
from ..retry import RetryPolicy
from .connection import CONNECTION_ERRORS, ConnectionSlot

__all__ = ["Housekeeper", "HousekeepingReport"]

logger = logging.getLogger("django_pgqueue.worker")

REAP_BATCH = 1000
STATS_RETENTION_SECONDS = 2 * 24 * 3600.0
DEAD_WORKER_RETENTION_SECONDS = 24 * 3600.0


@dataclass(frozen=True, slots=True)
class HousekeepingReport:
    """What one pass did (``ran`` is False when another worker held the lock)."""

    ran: bool
    reaped: int = 0
    dead_lettered: int = 0
    workers_marked_dead: int = 0
    pruned: int = 0

    @property
    def more_to_do(self) -> bool:
        """Return whether a batch came back full, so another pass should follow soon."""
        return self.reaped >= REAP_BATCH or self.pruned >= conf.PRUNE_BATCH_SIZE


def run_pass(slot: ConnectionSlot, *, worker_timeout: float) -> HousekeepingReport:
    """Run one housekeeping pass in one transaction, if this process wins the lock."""
    connection = slot.connection
    store = slot.store
    with connection.transaction():
        if not store.try_housekeeping_lock():
            return HousekeepingReport(ran=False)
        reaped = store.reap_expired(limit=REAP_BATCH, policy=RetryPolicy.from_settings())
        dead_workers = store.mark_silent_workers_dead(timeout_seconds=worker_timeout)
        pruned = 0
        retention = conf.RETENTION_SECONDS
        if retention is not None:
            pruned += store.prune_finished(retention_seconds=retention, limit=conf.PRUNE_BATCH_SIZE)
        dead_retention = conf.DEAD_LETTER_RETENTION_SECONDS
        if dead_retention is not None:
            pruned += store.prune_dead_letters(
                retention_seconds=dead_retention, limit=conf.PRUNE_BATCH_SIZE
            )
        store.prune_dead_workers(retention_seconds=DEAD_WORKER_RETENTION_SECONDS)
        store.prune_queue_stats(retention_seconds=STATS_RETENTION_SECONDS)
    report = HousekeepingReport(
        ran=True,
        reaped=len(reaped),
        dead_lettered=sum(1 for job in reaped if job.status == "dead_letter"),
        workers_marked_dead=len(dead_workers),
        pruned=pruned,
    )
    if reaped or dead_workers or pruned:
        logger.info(
            "housekeeping: %d expired leases recovered (%d dead-lettered), %d silent workers "
            "marked dead, %d old jobs pruned",
            report.reaped,
            report.dead_lettered,
            report.workers_marked_dead,
            report.pruned,
        )
    return report


class Housekeeper(threading.Thread):
    """Runs housekeeping passes every ``interval`` seconds (jittered) until stopped."""

    def __init__(self, *, alias: str, interval: float, worker_timeout: float, name: str) -> None:
        super().__init__(name="pgqueue-housekeeping", daemon=True)
        self._slot = ConnectionSlot(alias, name)
        self._interval = interval
        self._worker_timeout = worker_timeout
        self._stopping = threading.Event()
        self.passes = 0

    def stop(self) -> None:
        """Ask the thread to finish."""
        self._stopping.set()

    def run(self) -> None:
        """Loop until stopped."""
        delay = random.uniform(0, self._interval)  # noqa: S311 - spread workers' passes
        try:
            while not self._stopping.wait(delay):
                try:
                    report = run_pass(self._slot, worker_timeout=self._worker_timeout)
                    self.passes += 1
                    delay = 0.05 if report.more_to_do else self._interval * random.uniform(0.8, 1.2)  # noqa: S311
                except CONNECTION_ERRORS as error:
                    self._slot.reset()
                    logger.warning("housekeeping: connection lost (%s)", error)
                    delay = min(self._interval, 2.0)
                except Exception:
                    logger.exception("housekeeping pass failed")
                    delay = self._interval
        finally:
            self._slot.close()
