"""Documented import path of the enqueue values (``JobSpec``) and the queue store.

The code lives in :mod:`django_pgqueue.store`; this module only re-exports it.
``JobManager`` is :mod:`django_pgqueue.models`' (``Job.objects``).
"""

from django_pgqueue.store.queue import QueueStore
from django_pgqueue.store.reports import InvalidIndex, PausedQueue
from django_pgqueue.store.runners import DjangoRunner, PsycopgRunner
from django_pgqueue.store.values import (
    ClaimedJob,
    ClaimRound,
    DueSchedule,
    Enqueued,
    FailOutcome,
    Failure,
    FireResult,
    JobSnapshot,
    JobSpec,
    Lease,
    LeaseExtension,
    OperatorResult,
    PausedSchedule,
    ReapedJob,
    ScheduleDefinition,
)

__all__ = [
    "ClaimRound",
    "ClaimedJob",
    "DjangoRunner",
    "DueSchedule",
    "Enqueued",
    "FailOutcome",
    "Failure",
    "FireResult",
    "InvalidIndex",
    "JobSnapshot",
    "JobSpec",
    "Lease",
    "LeaseExtension",
    "OperatorResult",
    "PausedQueue",
    "PausedSchedule",
    "PsycopgRunner",
    "QueueStore",
    "ReapedJob",
    "ScheduleDefinition",
]
