"""Housekeeping: recover expired leases, mark silent workers dead, prune old rows.

Every worker runs the loop; in each step only the one that takes the transaction-level
advisory lock does the work, so exactly one worker at a time does it, also behind
PgBouncer in transaction mode (the lock dies with the transaction). A step that fails
is logged and the pass goes on with the next: one row the database refuses must never
stop the reaper for every other job.

Between passes, the same thread folds the signals producers left lazily (see
``fold_lazy_signals`` in sql/lease.sql) a few times a second, on every worker (the
statement skips signals another worker is folding).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import psycopg

from django_pgqueue.conf import conf
from django_pgqueue.store.queue import LAZY_FOLD_BATCH, QueueStore
from django_pgqueue.store.retry import RetryPolicy
from django_pgqueue.store.segments import Rotation, rotate
from django_pgqueue.store.values import ReapedJob
from django_pgqueue.worker.connection import CONNECTION_ERRORS, TRANSIENT_ERRORS, ConnectionSlot
from django_pgqueue.worker.cursor import ReapFloor
from django_pgqueue.worker.history import (
    maintain_history,
    move_finished,
    prune_history,
    prune_idempotency_keys,
)

__all__ = ["Housekeeper", "HousekeepingReport", "PartitionRepair", "run_pass"]


logger = logging.getLogger("django_pgqueue.worker")

REAP_BATCH = 1000
STATS_RETENTION_SECONDS = 2 * 24 * 3600.0
DEAD_WORKER_RETENTION_SECONDS = 24 * 3600.0
#: How long a coalesce key's row stays after it was made (or housekeeping found its job
#: still holding the key) before it is checked again: a key whose job was claimed is
#: forgotten at most this long (plus a pass) later, and a producer makes the row anew.
COALESCE_KEY_RECHECK_SECONDS = 300.0
#: How often lazy signals are folded: they only matter when every job ahead of a new one
#: left before its producer committed, so a fraction of a second is soon enough.
LAZY_FOLD_SECONDS = 0.25
#: How long a housekeeping step may sit idle in its transaction before the server ends
#: the session: a process paused inside a step would otherwise keep the housekeeping
#: lock from every worker, and the locks its DDL took (a history partition dropped,
#: whose parent every completion writes to) from the whole queue, for as long as the
#: pause lasts. A step runs its statements back to back, so only a paused (or badly
#: starved) process reaches it.
STEP_IDLE_SECONDS = 5.0
#: The longest a rotation step waits for a segment's or the job table's lock: every
#: statement on the job table queues behind a DETACH or TRUNCATE that waits.
SEGMENT_LOCK_WAIT_SECONDS = 0.05


@dataclass(frozen=True, slots=True)
class HousekeepingReport:
    """What one pass did (``ran`` is False when another worker held the lock)."""

    ran: bool
    reaped: int = 0
    dead_lettered: int = 0
    workers_marked_dead: int = 0
    pruned: int = 0
    partitions_repaired: int = 0
    history_partitions_made: int = 0
    history_partitions_dropped: int = 0
    moved_to_history: int = 0

    @property
    def more_to_do(self) -> bool:
        """Return whether a batch came back full, so another pass should follow soon."""
        return (
            self.reaped >= REAP_BATCH
            or self.pruned >= conf.PRUNE_BATCH_SIZE
            or self.moved_to_history >= conf.PRUNE_BATCH_SIZE
        )


def _step[T](
    slot: ConnectionSlot,
    work: Callable[[QueueStore], T],
    *,
    idle_timeout: float = STEP_IDLE_SECONDS,
) -> tuple[bool, T | None]:
    """Run one housekeeping step in its own short transaction, if the lock is free.

    Short transactions: a reaped row or a worker marked dead is not kept locked while
    the pass goes on pruning, so no heartbeat or outcome write waits on housekeeping.
    A step the database refuses is rolled back and logged, and reported as run with
    nothing done: the other steps still run. A lost connection is raised; so is the
    end of a session that sat idle in its step longer than ``idle_timeout`` seconds
    (the process was paused: see :data:`STEP_IDLE_SECONDS`).
    """
    connection = slot.connection
    store = slot.store
    try:
        with connection.transaction():
            if not store.try_housekeeping_lock(idle_timeout=idle_timeout):
                return False, None
            return True, work(store)
    except CONNECTION_ERRORS:
        raise
    except psycopg.Error:
        logger.exception("housekeeping: a step failed; the others go on")
        return True, None


def _reap(store: QueueStore, floor: ReapFloor | None = None) -> list[ReapedJob]:
    """Reap a batch; if the database refuses it, reap its jobs one at a time.

    A job whose move it refuses is logged and left for the next pass, so it cannot
    keep every other expired lease from being recovered. ``floor`` (the worker's) says
    where the batch's scan starts.
    """
    policy = RetryPolicy.from_settings()
    try:
        with store.runner.atomic():
            if floor is None:
                return store.reap_expired(limit=REAP_BATCH, policy=policy)
            since = floor.since()
            started = time.perf_counter()
            now = store.transaction_clock()
            batch = store.reap_expired(limit=REAP_BATCH, policy=policy, expired_since=since)
            floor.reaped(
                len(batch), REAP_BATCH, seconds=time.perf_counter() - started, database_now=now
            )
            return batch
    except CONNECTION_ERRORS:
        raise
    except psycopg.Error as error:
        logger.warning("housekeeping: reaping a batch failed (%s); one job at a time", error)
    reaped: list[ReapedJob] = []
    for job_id in store.expired_job_ids(limit=REAP_BATCH):
        try:
            with store.runner.atomic():
                reaped.extend(store.reap_expired(limit=1, policy=policy, job_ids=[job_id]))
        except CONNECTION_ERRORS:
            raise
        except psycopg.Error:
            logger.exception("housekeeping: job %s could not be reaped", job_id)
    return reaped


def run_pass(
    slot: ConnectionSlot,
    *,
    worker_timeout: float,
    repair: PartitionRepair | None = None,
    reap_floor: ReapFloor | None = None,
) -> HousekeepingReport:
    """Run one housekeeping pass, each step in its own transaction, if this process wins
    the lock (each step takes it again; another worker may do the next one)."""
    ran, reaped = _step(slot, lambda store: _reap(store, reap_floor))
    if not ran:
        return HousekeepingReport(ran=False)
    reaped = reaped or []
    _, dead = _step(
        slot, lambda store: store.mark_silent_workers_dead(timeout_seconds=worker_timeout)
    )
    dead_workers = dead or []
    pruned = 0
    retention = conf.RETENTION_SECONDS
    if retention is not None:
        _, count = _step(
            slot,
            lambda store: store.prune_finished(
                retention_seconds=retention, limit=conf.PRUNE_BATCH_SIZE
            ),
        )
        pruned += count or 0
    dead_retention = conf.DEAD_LETTER_RETENTION_SECONDS
    if dead_retention is not None:
        _, count = _step(
            slot,
            lambda store: store.prune_dead_letters(
                retention_seconds=dead_retention, limit=conf.PRUNE_BATCH_SIZE
            ),
        )
        pruned += count or 0
    _step(
        slot,
        lambda store: store.prune_dead_workers(retention_seconds=DEAD_WORKER_RETENTION_SECONDS),
    )
    _step(slot, lambda store: store.prune_queue_stats(retention_seconds=STATS_RETENTION_SECONDS))
    _step(slot, lambda store: store.prune_idle_concurrency_keys(limit=REAP_BATCH))
    _step(
        slot,
        lambda store: store.prune_coalesce_keys(
            limit=conf.PRUNE_BATCH_SIZE, recheck_seconds=COALESCE_KEY_RECHECK_SECONDS
        ),
    )
    _, upkeep = _step(slot, maintain_history)
    _, moved = _step(slot, move_finished)
    _, history = _step(slot, prune_history)
    _step(slot, prune_idempotency_keys)
    _, rotation = _step(slot, lambda store: _rotate(slot))
    if history is not None:
        pruned += history.deleted
    repaired = 0
    if repair is not None:
        _, fixed = _step(slot, repair.run)
        repaired = fixed or 0
    report = HousekeepingReport(
        ran=True,
        reaped=len(reaped),
        dead_lettered=sum(1 for job in reaped if job.status == "dead_letter"),
        workers_marked_dead=len(dead_workers),
        pruned=pruned,
        partitions_repaired=repaired,
        history_partitions_made=upkeep.partitions_made if upkeep else 0,
        history_partitions_dropped=history.dropped if history else 0,
        moved_to_history=moved or 0,
    )
    if history is not None and (history.dropped or history.deferred):
        logger.info(
            "housekeeping: %d history partitions dropped (about %d jobs), %d left for the "
            "next pass (a lock was not granted in time)",
            history.dropped,
            history.rows_estimate,
            history.deferred,
        )
    if upkeep is not None and upkeep.partitions_skipped:
        logger.info(
            "housekeeping: %d history periods could not be given a partition yet (another "
            "period length, rows in a DEFAULT partition, or a lock); retried next pass",
            upkeep.partitions_skipped,
        )
    if moved:
        logger.info("housekeeping: %d finished jobs moved to the history", moved)
    if rotation is not None:
        _log_rotation(rotation)
    if reaped or dead_workers or pruned or repaired:
        logger.info(
            "housekeeping: %d expired leases recovered (%d dead-lettered), %d silent workers "
            "marked dead, %d old jobs pruned, %d partitions repaired",
            report.reaped,
            report.dead_lettered,
            report.workers_marked_dead,
            report.pruned,
            report.partitions_repaired,
        )
    return report


def _rotate(slot: ConnectionSlot) -> Rotation | None:
    return rotate(
        slot.connection,
        jobs_per_segment=conf.SEGMENT_JOBS,
        max_holding=conf.SEGMENT_LIMIT,
        lock_wait=SEGMENT_LOCK_WAIT_SECONDS,
    )


def _log_rotation(rotation: Rotation) -> None:
    if rotation.attached is not None:
        logger.info("housekeeping: job table segment %d attached", rotation.attached)
    if rotation.switched_to is not None:
        logger.info("housekeeping: new jobs go to segment %d", rotation.switched_to)
    if rotation.truncated or rotation.dropped:
        logger.info(
            "housekeeping: job table segments emptied: %s; detached and dropped: %s",
            ", ".join(map(str, rotation.truncated)) or "none",
            ", ".join(map(str, rotation.dropped)) or "none",
        )
    if rotation.at_bound:
        logger.warning(
            "housekeeping: no new job table segment: segments %s still hold jobs "
            "(PGQUEUE_SEGMENT_LIMIT); new jobs stay in the current one",
            ", ".join(map(str, rotation.holding)),
        )


class PartitionRepair:
    """Finds partitions whose claim state disagrees with the job table and refreshes them.

    Normally there are none: every statement keeps the partition rows. The sweep covers
    what no statement of this release wrote: jobs enqueued or finished by a worker or
    web server of an older release during a rolling deploy, and rows changed by hand. It
    walks the partitions with pending jobs a slice at a time (SCAN_LIMIT per pass), so a
    pass costs the same however many partitions there are.
    """

    SCAN_LIMIT = 2000

    def __init__(self) -> None:
        self._after = ""

    def run(self, store: QueueStore) -> int:
        """Check the next slice of partitions and repair what disagrees; return how many."""
        keys, resume = store.partitions_out_of_date(
            after_key=self._after, scan_limit=self.SCAN_LIMIT
        )
        self._after = resume or ""
        if keys:
            logger.warning(
                "housekeeping: %d partitions had out-of-date claim state (written by an "
                "older release, or by hand); refreshing them",
                len(keys),
            )
        return store.repair_partitions(keys)


class Housekeeper(threading.Thread):
    """Runs housekeeping passes every ``interval`` seconds (jittered) until stopped."""

    def __init__(self, *, alias: str, interval: float, worker_timeout: float, name: str) -> None:
        super().__init__(name="pgqueue-housekeeping", daemon=True)
        self._slot = ConnectionSlot(alias, name)
        self._interval = interval
        self._worker_timeout = worker_timeout
        self._stopping = threading.Event()
        self._repair = PartitionRepair()
        self._reap_floor = ReapFloor()
        self.passes = 0

    def stop(self) -> None:
        """Ask the thread to finish."""
        self._stopping.set()

    def run(self) -> None:
        """Loop until stopped: fold lazy signals often, run a pass every interval."""
        next_pass = time.monotonic() + random.uniform(0, self._interval)  # noqa: S311 - spread workers' passes
        try:
            while not self._stopping.wait(min(LAZY_FOLD_SECONDS, next_pass - time.monotonic())):
                try:
                    self._fold_lazy_signals()
                    if time.monotonic() < next_pass:
                        continue
                    report = run_pass(
                        self._slot,
                        worker_timeout=self._worker_timeout,
                        repair=self._repair,
                        reap_floor=self._reap_floor,
                    )
                    self.passes += 1
                    delay = 0.05 if report.more_to_do else self._interval * random.uniform(0.8, 1.2)  # noqa: S311
                except TRANSIENT_ERRORS as error:
                    logger.warning("housekeeping: %s; retrying", error)
                    delay = min(self._interval, 1.0)
                except CONNECTION_ERRORS as error:
                    self._slot.reset()
                    # A pass cut off may not have recovered what its floor says it did.
                    self._reap_floor = ReapFloor()
                    logger.warning("housekeeping: connection lost (%s)", error)
                    delay = min(self._interval, 2.0)
                except Exception:
                    logger.exception("housekeeping pass failed")
                    delay = self._interval
                next_pass = time.monotonic() + delay
        finally:
            self._slot.close()

    def _fold_lazy_signals(self) -> None:
        """Fold lazy signals, batch after batch while batches come back full.

        Its own statements in autocommit: each fold locks rows in key order and waits
        only on other refreshes of the same partitions and keys.
        """
        while not self._stopping.is_set():
            taken, _ = self._slot.run(lambda store: store.fold_lazy_signals())
            if taken < LAZY_FOLD_BATCH:
                return
