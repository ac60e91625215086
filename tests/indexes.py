"""Helpers of the index tests: validity, INVALID indexes made on purpose, operations run.

Each way of making an INVALID index is a real failure of PostgreSQL's, not a catalog
edit: a unique build that meets a duplicate, or a build cancelled with
``pg_cancel_backend`` while it waits for a writer to finish.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from django.db import connection
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.operations.base import Operation

from tests.admin_seed import FINISHED
from tests.workers import wait_for

APP = "django_pgqueue"
JOB_TABLE = "django_pgqueue_job"

_VALIDITY = (
    "SELECT pg_index.indisvalid FROM pg_index "
    "JOIN pg_class ON pg_class.oid = pg_index.indexrelid WHERE pg_class.relname = %s"
)
_PHASE = "SELECT phase FROM pg_stat_progress_create_index WHERE pid = %s AND relid = %s::regclass"


def validity(conn: psycopg.Connection[Any], index_name: str) -> bool | None:
    """Return whether the index is valid; None if there is no index of that name."""
    row = conn.execute(_VALIDITY, [index_name]).fetchone()
    return None if row is None else bool(row[0])


def index_oid(conn: psycopg.Connection[Any], index_name: str) -> int:
    """Return the index's oid: a rebuilt index has a new one."""
    return int(conn.execute("SELECT %s::regclass::oid", [index_name]).fetchone()[0])


def seed_finished_jobs(conn: psycopg.Connection[Any], rows: int) -> None:
    """Insert ``rows`` finished jobs (no worker will claim them), committed."""
    conn.execute(FINISHED, {"rows": rows})


def break_unique_index(conn: psycopg.Connection[Any], index_name: str) -> None:
    """Leave an INVALID index ``index_name`` on the job table (needs two jobs or more).

    A unique build on a constant meets a duplicate key and fails, as a concurrent build
    does, leaving its index behind.
    """
    with pytest.raises(psycopg.errors.UniqueViolation):
        conn.execute(f'CREATE UNIQUE INDEX CONCURRENTLY "{index_name}" ON {JOB_TABLE} ((1))')
    assert validity(conn, index_name) is False


def cancel_while_waiting_for_writers(
    open_connection: Callable[..., psycopg.Connection[Any]], statement: str
) -> None:
    """Run a concurrent index ``statement`` and cancel it while it waits for a writer.

    A transaction holding a write lock on the job table makes every concurrent build wait
    after it has put its index in the catalog; ``pg_cancel_backend`` then leaves that
    index INVALID, exactly as a ``statement_timeout`` would.
    """
    writer = open_connection(prepare=False)
    writer.execute("BEGIN")
    writer.execute(f"LOCK TABLE {JOB_TABLE} IN ROW EXCLUSIVE MODE")
    builder = open_connection(prepare=False)
    watcher = open_connection(prepare=False)
    pid = builder.info.backend_pid
    errors: list[BaseException] = []

    def build() -> None:
        try:
            builder.execute(statement)
        except psycopg.Error as error:
            errors.append(error)

    thread = threading.Thread(target=build, daemon=True)
    thread.start()
    try:
        wait_for(
            lambda: (
                (row := watcher.execute(_PHASE, [pid, JOB_TABLE]).fetchone())
                and row[0].startswith("waiting for writers")
            ),
            timeout=20,
            message=f"{statement!r} to wait for the writer",
        )
        watcher.execute("SELECT pg_cancel_backend(%s)", [pid])
        thread.join(20)
    finally:
        writer.execute("ROLLBACK")
    assert not thread.is_alive()
    assert [type(error) for error in errors] == [psycopg.errors.QueryCanceled]


def run_operation(operation: Operation, *, backwards: bool = False) -> None:
    """Apply one migration operation of our app on Django's connection, outside a transaction."""
    before = MigrationLoader(connection).project_state()
    after = before.clone()
    operation.state_forwards(APP, after)
    with connection.schema_editor(atomic=False) as editor:
        if backwards:
            operation.database_backwards(APP, editor, after, before)
        else:
            operation.database_forwards(APP, editor, before, after)
