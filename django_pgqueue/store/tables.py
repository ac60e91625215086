"""Is the queue's schema there? Missing tables found before they cost a traceback.

Forgetting ``migrate`` (or running it against another database) is the first mistake of
many new users; the check (E007), the worker's start and enqueue all turn it into one
line that says what to run.
"""

from __future__ import annotations

from django.apps import apps
from django.db import DatabaseError
from psycopg import errors as pg_errors

from django_pgqueue.store.queue import QueueStore
from django_pgqueue.store.runners import DjangoRunner

__all__ = ["is_undefined_table", "missing_tables", "queue_tables"]


def queue_tables() -> list[str]:
    """Return the tables ``django_pgqueue``'s migrations create."""
    config = apps.get_app_config("django_pgqueue")
    return [
        model._meta.db_table
        for model in config.get_models()
        if model._meta.managed and not model._meta.proxy
    ]


def missing_tables(alias: str) -> list[str]:
    """Return the queue's tables absent from database ``alias`` (empty when migrated).

    Runs one catalog query on Django's connection for ``alias``; connection errors
    propagate.
    """
    return QueueStore(DjangoRunner(alias)).missing_tables(queue_tables())


def is_undefined_table(error: BaseException) -> bool:
    """Return True if ``error`` is, or was caused by, SQLSTATE 42P01 (undefined_table)."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, pg_errors.UndefinedTable):
            return True
        # Django wraps driver errors in its own DatabaseError, chained with __cause__.
        seen = seen.__cause__ if isinstance(seen, DatabaseError) else None
    return False
