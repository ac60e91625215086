"""The job table without its unique key indexes: what a segmented job table will have.

``pgq_job_idempotency_key`` and ``pgq_job_coalesce_key`` stay in this release only for
the previous release's producers (migration 0026); the key tables must keep one job per
key without them. :func:`without_unique_indexes` (a fixture in conftest) drops both, and
the clause of the coalesced enqueue function that names one, for a test's duration.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from importlib import import_module
from typing import Any

import psycopg

from django_pgqueue.store.sql import _without

_migration = import_module("django_pgqueue.migrations.0026_keys_outside_job_indexes")

UNIQUE_INDEXES = ("pgq_job_idempotency_key", "pgq_job_coalesce_key")


#: The coalesced enqueue function as migration 0026 makes it, and as the release without
#: the indexes will have it (without its backstop section).
WITH_BACKSTOP = _migration.ENQUEUE_COALESCED


def _without_backstop() -> str:
    lines = WITH_BACKSTOP.splitlines()
    kept = _without(lines, "backstop")
    dropped = [line.strip() for line in lines if line not in kept]
    assert dropped[:2] == [
        "-- begin backstop",
        "ON CONFLICT (coalesce_key) WHERE status = 'pending' AND coalesce_key IS NOT NULL",
    ]
    assert dropped[-1] == "-- end backstop"
    return "\n".join(kept)


@contextmanager
def without_unique_indexes(observer: psycopg.Connection[Any]) -> Iterator[None]:
    """Drop the job table's unique key indexes, and the coalesced enqueue's backstop
    clause that names one; put both back afterwards, as they were."""
    observer.execute(_without_backstop())
    definitions = [
        observer.execute("SELECT pg_get_indexdef(%s::regclass)", [name]).fetchone()[0]
        for name in UNIQUE_INDEXES
    ]
    assert all(" UNIQUE " in definition for definition in definitions)
    for name in UNIQUE_INDEXES:
        observer.execute(f"DROP INDEX {name}")
    try:
        yield
    finally:
        # A failed test can leave a producer's transaction open, which would block the
        # index builds; a duplicate it made would fail a unique one.
        observer.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND state LIKE 'idle in transaction%'"
        )
        observer.execute("DELETE FROM django_pgqueue_job")
        for definition in definitions:
            observer.execute(definition)
        observer.execute(WITH_BACKSTOP)
