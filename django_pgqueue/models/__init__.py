"""The queue schema: the job inbox, flow control, the worker registry and schedules.

One module per group of tables; every model is importable from here, the path Django
and the migrations use (``django_pgqueue.models.Job``, ``django_pgqueue.models.BrinIndex``).
"""

# In the order the tables were added: Django lists an app's tables (in checks, in
# "tables missing") in the order its models were defined, the inbox first.
from django_pgqueue.models.job import DeadLetter, Dependency, Job, Lag, LiveJob  # isort: skip
from django_pgqueue.models.flow import (  # isort: skip
    ConcurrencyKey,
    ConcurrencySignal,
    Partition,
    PartitionSignal,
)
from django_pgqueue.models.workers import QueueStat, Worker  # isort: skip
from django_pgqueue.models.schedules import Schedule, ScheduleSource  # isort: skip
from django_pgqueue.models.pauses import QueuePause  # isort: skip
from django_pgqueue.models.sqlapi import SqlSettings  # isort: skip
from django_pgqueue.models.history import (  # isort: skip
    HistoryClass,
    HistoryJob,
    IdempotencyKey,
)
from django_pgqueue.models.keys import CoalesceKey  # isort: skip

# isort: split
from django_pgqueue.models.base import BrinIndex
from django_pgqueue.models.manager import JobManager

__all__ = [
    "BrinIndex",
    "CoalesceKey",
    "ConcurrencyKey",
    "ConcurrencySignal",
    "DeadLetter",
    "Dependency",
    "HistoryClass",
    "HistoryJob",
    "IdempotencyKey",
    "Job",
    "JobManager",
    "Lag",
    "LiveJob",
    "Partition",
    "PartitionSignal",
    "QueuePause",
    "QueueStat",
    "Schedule",
    "ScheduleSource",
    "SqlSettings",
    "Worker",
]
