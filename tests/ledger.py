"""The execution ledger: test tasks record what really ran, over their own connection.

The ledger connection is autocommit and separate from the handler's, so entries survive
a handler's rollback and are written before a worker is killed.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import psycopg

_connection: psycopg.Connection[Any] | None = None
_lock = threading.Lock()
# How long a write keeps reconnecting (a server restart takes a few seconds).
RECONNECT_SECONDS = 20.0


def _conn() -> psycopg.Connection[Any]:
    global _connection  # noqa: PLW0603
    if _connection is None or _connection.closed or _connection.broken:
        from django_pgqueue.store.pgconn import connect

        _connection = connect("default", prepare=False, application_name="test ledger")
        # The embedded server runs with synchronous_commit off (speed): a crash of the
        # server (an immediate restart test) may lose the last commits. The ledger is the
        # witness of what ran: its commits must survive such a crash.
        _connection.execute("SET synchronous_commit = on")
    return _connection


def write(
    job_id: int, event: str, *, attempt: int = 0, lease_generation: int = 0, label: str = ""
) -> None:
    """Append one ledger entry (timestamped by the database clock).

    Retries for a while when the connection is lost: a fault-injection test may terminate
    it or restart the server, and a lost entry would read as an execution that never ended.
    """
    global _connection  # noqa: PLW0603
    deadline = time.monotonic() + RECONNECT_SECONDS
    while True:
        try:
            with _lock:
                _conn().execute(
                    "INSERT INTO tests_ledgerentry "
                    "(job_id, event, attempt, lease_generation, worker_pid, label, at) "
                    "VALUES (%s, %s, %s, %s, %s, %s, clock_timestamp())",
                    [job_id, event, attempt, lease_generation, os.getpid(), label],
                )
            return
        except psycopg.OperationalError:
            _connection = None
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def entries(conn: psycopg.Connection[Any], job_id: int | None = None) -> list[dict[str, Any]]:
    """Return ledger entries (optionally of one job) in the order they were written."""
    sql = (
        "SELECT job_id, event, attempt, lease_generation, worker_pid, label, at "
        "FROM tests_ledgerentry"
    )
    params: list[Any] = []
    if job_id is not None:
        sql += " WHERE job_id = %s"
        params.append(job_id)
    sql += " ORDER BY id"
    with conn.cursor(row_factory=psycopg.rows.dict_row) as cursor:
        return cursor.execute(sql, params).fetchall()
