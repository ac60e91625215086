"""Retention classes of the history tier, and what its upkeep reports.

A class is a final status, for every queue or for one queue; housekeeping writes the
classes the settings define (``sync_history_classes``) and drops a class's partitions
once they are older than its retention.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django_pgqueue.limits import HISTORY_PERIODS, RETENTION_STATUSES
from django_pgqueue.states import JobStatus

__all__ = [
    "HISTORY_PERIODS",
    "HistoryPartition",
    "HistoryPrune",
    "RetentionClass",
    "classes_from",
    "default_classes",
]


@dataclass(frozen=True, slots=True)
class RetentionClass:
    """How long finished jobs of one status (of every queue, or of one) are kept."""

    status: str
    queue: str | None
    keep_seconds: float | None


@dataclass(frozen=True, slots=True)
class HistoryPrune:
    """One pruning pass: partitions dropped (and their estimated rows), left for later
    because a lock was not granted in time, and expired rows deleted from DEFAULT
    partitions."""

    dropped: int
    rows_estimate: int
    deferred: int
    deleted: int


@dataclass(frozen=True, slots=True)
class HistoryPartition:
    """One partition of the history; a DEFAULT partition has no bounds."""

    class_id: int
    status: str
    queue: str | None
    keep_seconds: float | None
    retired: bool
    partition_name: str
    lower_bound: datetime | None
    upper_bound: datetime | None
    rows_estimate: int


def classes_from(retention: dict[str | None, dict[str, float | None]]) -> list[RetentionClass]:
    """Return the classes of a resolved PGQUEUE_RETENTION (``conf.RETENTION``): the three
    every-queue ones first, then one per status a queue gives its own retention."""
    every = retention[None]
    classes = [RetentionClass(status, None, every[status]) for status in RETENTION_STATUSES]
    for queue, own in retention.items():
        if queue is not None:
            classes.extend(
                RetentionClass(status, queue, own[status])
                for status in RETENTION_STATUSES
                if status in own
            )
    return classes


def default_classes(
    *, finished_seconds: float | None, dead_letter_seconds: float | None
) -> list[RetentionClass]:
    """Return the three every-queue classes: succeeded and cancelled jobs are kept for
    ``finished_seconds``, dead letters for ``dead_letter_seconds`` (None: kept)."""
    return [
        RetentionClass(JobStatus.SUCCEEDED.value, None, finished_seconds),
        RetentionClass(JobStatus.CANCELLED.value, None, finished_seconds),
        RetentionClass(JobStatus.DEAD_LETTER.value, None, dead_letter_seconds),
    ]
