"""Keep the SQL enqueue function's settings row in step with Django's settings.

``django_pgqueue_enqueue()`` cannot read settings; it reads ``django_pgqueue_sql_settings``
(migration 0017). ``migrate`` writes the row of the database it migrated and each worker
writes its own database's row when it starts, from what this process's settings say:
the queues of every ``PgQueueBackend`` on that database, the enqueue defaults, the limits
and the wake-up channels.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import DatabaseError, connections

from django_pgqueue.compat import task_backends
from django_pgqueue.conf import conf
from django_pgqueue.limits import parse_rate
from django_pgqueue.store.queue import QueueStore
from django_pgqueue.store.runners import DjangoRunner
from django_pgqueue.tasks.backend import PgQueueBackend

__all__ = ["after_migrate", "queues_of_database", "sync_sql_settings"]

logger = logging.getLogger("django_pgqueue")


def queues_of_database(database: str) -> set[str] | None:
    """Return the queues of the backends on ``database`` (None: a backend takes any)."""
    queues: set[str] = set()
    for alias in task_backends.settings:
        backend = task_backends[alias]
        if isinstance(backend, PgQueueBackend) and backend.database == database:
            if not backend.queues:
                return None
            queues.update(backend.queues)
    return queues


def sync_sql_settings(database: str, *, synced_by: str) -> None:
    """Write ``database``'s settings row for ``django_pgqueue_enqueue()``."""
    queues = queues_of_database(database)
    QueueStore(DjangoRunner(database)).sync_sql_settings(
        queues=None if queues is None else sorted(queues),
        concurrency_limits=conf.CONCURRENCY_LIMITS,
        rate_limits={name: parse_rate(name, rate) for name, rate in conf.RATE_LIMITS.items()},
        synced_by=synced_by,
    )


def after_migrate(*, using: str, **kwargs: Any) -> None:
    """``post_migrate``: write the settings ``django_pgqueue_enqueue()`` applies there."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        if "django_pgqueue_sql_settings" not in connection.introspection.table_names(cursor):
            return  # migrated back before 0017
    try:
        sync_sql_settings(using, synced_by="migrate")
    except DatabaseError as error:
        logger.warning("could not write the SQL enqueue settings of %r: %s", using, error)
