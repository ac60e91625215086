"""Housekeeping of the history tier: retention classes, partitions ahead, pruning.

Two steps of each housekeeping pass (see :mod:`django_pgqueue.worker.housekeeping`):
the classes are written from the settings and the missing partitions made in one
transaction, so no class is ever visible without its partitions; pruning drops whole
partitions in another. Every lock wait is bounded by :data:`LOCK_WAIT_SECONDS`: DDL
queued behind a long reader of the history would stop every job finishing meanwhile,
and a step that times out is simply tried again on the next pass.
"""

from __future__ import annotations

from dataclasses import dataclass

from django_pgqueue.conf import conf
from django_pgqueue.store.queue import QueueStore
from django_pgqueue.store.retention import HistoryPrune, classes_from

__all__ = [
    "KEY_RECHECK_SECONDS",
    "LOCK_WAIT_SECONDS",
    "MAX_DROPS",
    "HistoryUpkeep",
    "maintain_history",
    "move_finished",
    "prune_history",
    "prune_idempotency_keys",
]

#: The longest a history step waits for a lock (a partition's, the history table's).
LOCK_WAIT_SECONDS = 0.5
#: Partitions dropped per pass at most: each drop holds its parent's lock until commit.
MAX_DROPS = 50
#: How often a taken idempotency key is checked for a job still holding it: a key is
#: free again at most this long (plus a pass) after its job was pruned.
KEY_RECHECK_SECONDS = 3600.0
#: Finished jobs moved from the job table to the history per pass at most.
MOVE_BATCH = 10_000


@dataclass(frozen=True, slots=True)
class HistoryUpkeep:
    """The classes written, the partitions made, and periods that could not be attached."""

    classes_written: int
    partitions_made: int
    partitions_skipped: int


def maintain_history(store: QueueStore) -> HistoryUpkeep:
    """Write the retention classes and make the missing partitions, in one transaction."""
    store.limit_lock_wait(timeout_seconds=LOCK_WAIT_SECONDS)
    written, retired = store.sync_history_classes(classes_from(conf.resolved_retention()))
    made, skipped = store.ensure_history_partitions(
        period=conf.HISTORY_PERIOD, ahead=conf.HISTORY_PREMAKE
    )
    return HistoryUpkeep(
        classes_written=written + retired, partitions_made=made, partitions_skipped=skipped
    )


def prune_history(store: QueueStore) -> HistoryPrune:
    """Drop the partitions past their class's retention (and expired DEFAULT rows)."""
    store.limit_lock_wait(timeout_seconds=LOCK_WAIT_SECONDS)
    return store.prune_history(max_drops=MAX_DROPS, default_limit=conf.PRUNE_BATCH_SIZE)


def move_finished(store: QueueStore) -> int:
    """Move a batch of finished jobs left in the job table to the history.

    At most :data:`MOVE_BATCH` however large ``PGQUEUE_PRUNE_BATCH_SIZE`` is: the batch
    is one ``id = ANY(ARRAY(...))`` statement, and a million ids in one made a single
    batch run for over ten minutes where 5,000-row batches moved two million rows in a
    minute.
    """
    return store.move_finished(limit=min(conf.PRUNE_BATCH_SIZE, MOVE_BATCH))


def prune_idempotency_keys(store: QueueStore) -> int:
    """Free a batch of idempotency keys whose jobs are gone from both tiers."""
    return store.prune_idempotency_keys(
        limit=conf.PRUNE_BATCH_SIZE, recheck_seconds=KEY_RECHECK_SECONDS
    )
