"""The queue store: the only code that executes queue SQL.

:class:`QueueStore` runs the named statements of ``sql/*.sql`` on one connection and
returns typed values (:mod:`django_pgqueue.store.values`). It is bound either to a Django
connection (a :class:`~django_pgqueue.store.runners.DjangoRunner`, so enqueueing joins the
caller's transaction and shows up in Django's query logging) or to a worker's own psycopg
connection (a :class:`~django_pgqueue.store.runners.PsycopgRunner`, server-side binding and
prepared statements). Each ``sql/<file>.sql`` has its module in
:mod:`django_pgqueue.store.statements`; what an enqueue checks before it writes is in
:mod:`django_pgqueue.store.intake`.
"""

from __future__ import annotations

from django_pgqueue.store.statements.admin import AdminStatements
from django_pgqueue.store.statements.base import (
    CANCEL_PATIENCE,
    FOLD_BATCH,
    HOUSEKEEPING_LOCK_KEY,
    LAZY_FOLD_BATCH,
    OPERATOR_CHUNK,
    SCHEDULE_SYNC_LOCK_KEY,
)
from django_pgqueue.store.statements.dependencies import DependencyStatements
from django_pgqueue.store.statements.enqueue import EnqueueStatements
from django_pgqueue.store.statements.flow import FlowStatements
from django_pgqueue.store.statements.health import HealthStatements
from django_pgqueue.store.statements.history import HistoryStatements
from django_pgqueue.store.statements.lease import LeaseStatements
from django_pgqueue.store.statements.maintenance import MaintenanceStatements
from django_pgqueue.store.statements.metrics import MetricsStatements
from django_pgqueue.store.statements.operator import OperatorStatements
from django_pgqueue.store.statements.schedules import ScheduleStatements
from django_pgqueue.store.statements.schema import SchemaStatements

__all__ = [
    "CANCEL_PATIENCE",
    "FOLD_BATCH",
    "HOUSEKEEPING_LOCK_KEY",
    "LAZY_FOLD_BATCH",
    "OPERATOR_CHUNK",
    "SCHEDULE_SYNC_LOCK_KEY",
    "QueueStore",
]


class QueueStore(
    EnqueueStatements,
    LeaseStatements,
    # Operators revive dependents and reap (after those two, for a consistent MRO).
    OperatorStatements,
    DependencyStatements,
    MaintenanceStatements,
    HistoryStatements,
    AdminStatements,
    MetricsStatements,
    HealthStatements,
    FlowStatements,
    ScheduleStatements,
    SchemaStatements,
):
    """Every queue operation, bound to one connection.

    Methods ending in ``_if_leased`` apply only while the caller holds the lease they
    name; single-job ones raise :class:`~django_pgqueue.exceptions.LeaseLost` otherwise
    (changing nothing), batch ones return the ids that applied.
    """
