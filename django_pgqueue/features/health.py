"""Health probes: is this host's worker alive, and can this deployment serve the queue?

``manage.py queuehealth`` is a thin shell over :func:`liveness` and :func:`readiness`;
each returns a :class:`ProbeResult` whose reason is one line, printed by the command.

* Liveness asks whether a restart would help: it fails when this host's worker stopped
  heartbeating (hung, or gone). It passes while the database is unreachable: no worker
  can heartbeat then, and restarting every worker pod would not bring the database back.
* Readiness asks whether the database can serve the queue now: reachable, and migrated.
  Paused queues are named in its line but do not fail it: a pause is an operator's
  decision, and the deployment can still enqueue.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import psycopg
from django.db import DatabaseError, connections
from django.db.migrations.executor import MigrationExecutor

from django_pgqueue.store.pgconn import connect
from django_pgqueue.store.queue import QueueStore
from django_pgqueue.store.runners import PsycopgRunner
from django_pgqueue.store.tables import queue_tables

__all__ = ["ProbeResult", "liveness", "readiness"]

APP_LABEL = "django_pgqueue"


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """The verdict of one probe and its reason, one line."""

    ok: bool
    reason: str


def readiness(alias: str, *, connect_timeout: int = 5) -> ProbeResult:
    """Return whether database ``alias`` is reachable and has every queue migration applied.

    Opens one short-lived connection (at most ``connect_timeout`` seconds to connect),
    then reads the migration history through Django's connection, which it closes.
    """
    try:
        conn = connect(
            alias, prepare=False, connect_timeout=connect_timeout, application_name="queuehealth"
        )
    except psycopg.OperationalError as error:
        return ProbeResult(False, f"database {alias!r} is unreachable: {_first_line(error)}")
    try:
        store = QueueStore(PsycopgRunner(conn, alias))
        missing = store.missing_tables(queue_tables())
        paused = {} if missing else store.paused_queues()
    finally:
        conn.close()
    fix = f"run manage.py migrate --database {alias}"
    if missing:
        return ProbeResult(
            False, f"database {alias!r} lacks the queue's tables ({', '.join(missing)}): {fix}"
        )
    try:
        unapplied = _unapplied_migrations(alias)
    except DatabaseError as error:
        return ProbeResult(False, f"database {alias!r} is unreachable: {_first_line(error)}")
    finally:
        connections[alias].close()
    if unapplied:
        return ProbeResult(
            False,
            f"database {alias!r} has unapplied {APP_LABEL} migrations "
            f"({', '.join(unapplied)}): {fix}",
        )
    reason = f"database {alias!r} is reachable and migrated"
    if paused:
        reason += "; paused queues: " + ", ".join(
            f"{pause.queue} (since {pause.paused_at:%Y-%m-%d %H:%M:%S %Z}"
            f"{f' by {pause.paused_by}' if pause.paused_by else ''})"
            for pause in paused.values()
        )
    return ProbeResult(True, reason)


def liveness(
    alias: str,
    *,
    timeout_seconds: float,
    hostname: str | None = None,
    worker_id: str | None = None,
    connect_timeout: int = 5,
) -> ProbeResult:
    """Return whether this host's worker (or ``worker_id``) heartbeated within the timeout.

    By host (``hostname``, default this machine's), it fails when no worker of the host
    has heartbeated within ``timeout_seconds``, or when one whose process still runs here
    has not (a hung process among several). Passes while the database is unreachable.
    """
    try:
        conn = connect(
            alias, prepare=False, connect_timeout=connect_timeout, application_name="queuehealth"
        )
    except psycopg.OperationalError as error:
        return ProbeResult(
            True, f"cannot tell (database {alias!r} is unreachable: {_first_line(error)})"
        )
    try:
        if worker_id is not None:
            rows = QueueStore(PsycopgRunner(conn, alias)).worker_heartbeats(worker_id=worker_id)
        else:
            hostname = hostname or socket.gethostname()
            rows = QueueStore(PsycopgRunner(conn, alias)).worker_heartbeats(hostname=hostname)
    finally:
        conn.close()
    if not rows:
        if worker_id is not None:
            return ProbeResult(False, f"worker {worker_id!r} is not registered or is dead")
        return ProbeResult(False, f"no live worker of host {hostname!r} is registered")
    subject = f"worker {worker_id!r}" if worker_id is not None else f"host {hostname!r}"
    if worker_id is None:
        for row in rows:
            if row.silent_seconds > timeout_seconds and _process_exists(row.pid):
                return ProbeResult(
                    False,
                    f"worker {row.worker_id!r} (pid {row.pid}) has not heartbeated for "
                    f"{row.silent_seconds:.0f}s (timeout {timeout_seconds:g}s)",
                )
    newest = rows[0]
    if newest.silent_seconds > timeout_seconds:
        verdict = (
            f"{subject} has not heartbeated"
            if worker_id is not None
            else f"no worker of {subject} has heartbeated"
        )
        return ProbeResult(
            False,
            f"{verdict} within {timeout_seconds:g}s "
            f"(last: {newest.worker_id!r}, {newest.silent_seconds:.0f}s ago)",
        )
    return ProbeResult(
        True, f"worker {newest.worker_id!r} heartbeated {newest.silent_seconds:.1f}s ago"
    )


def _unapplied_migrations(alias: str) -> list[str]:
    executor = MigrationExecutor(connections[alias])
    targets = [key for key in executor.loader.graph.leaf_nodes() if key[0] == APP_LABEL]
    return [
        migration.name
        for migration, _backwards in executor.migration_plan(targets)
        if migration.app_label == APP_LABEL
    ]


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: it exists
    return True


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
