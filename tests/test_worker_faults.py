"""Database faults: backends terminated, the server restarted mid-run.

Restarts only ever hit the suite's own embedded server (never a server named by
DATABASE_URL): these tests make a fresh database on it, whatever the other tests use.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import connections

from django_pgqueue.store.queue import QueueStore
from django_pgqueue.store.runners import PsycopgRunner
from django_pgqueue.store.values import JobSpec
from django_pgqueue.tools.embedded import with_dbname
from tests.database import REPO, embedded_server
from tests.workers import WorkerProcess, wait_for

pytestmark = pytest.mark.timeout(240)

RECOVERY = {"HOUSEKEEPING_INTERVAL_SECONDS": 0.3, "RETRY_BASE_SECONDS": 0.05, "RETRY_JITTER": 0}


def _status_counts(conn: psycopg.Connection[Any]) -> dict[str, int]:
    return dict(
        conn.execute("SELECT status, count(*) FROM django_pgqueue_job_all GROUP BY 1").fetchall()
    )


def _stuck_jobs(url: str) -> str:
    """The status counts, and the unfinished jobs with their lease and the database clock."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT id, status, attempts, claimed_by, lease_generation, lease_expires_at,"
            " available_at, now() FROM django_pgqueue_job ORDER BY id LIMIT 20"
        ).fetchall()
        workers = (
            conn.execute("SELECT * FROM django_pgqueue_worker ORDER BY 1").fetchall()
            if _has_table(conn, "django_pgqueue_worker")
            else []
        )
        return f"counts {_status_counts(conn)}; unfinished {rows}; workers {workers}"


def _has_table(conn: psycopg.Connection[Any], name: str) -> bool:
    return conn.execute("SELECT to_regclass(%s) IS NOT NULL", [name]).fetchone()[0]


def test_terminated_backends_are_reconnected_and_nothing_is_lost(workers, store, observer):
    store.enqueue_many(
        [JobSpec("tests.tasks.ledger_sleep", kwargs={"seconds": 0.01}) for _ in range(100)]
    )
    worker = workers("--lease-seconds", "2", "--poll-interval", "30", settings=RECOVERY)
    worker_id = worker.wait_registered(observer)
    wait_for(lambda: _status_counts(observer).get("succeeded", 0) >= 20, timeout=60)

    def backends() -> list[str]:
        return [
            row[0]
            for row in observer.execute(
                "SELECT application_name FROM pg_stat_activity WHERE application_name LIKE %s",
                ["pgqueue %"],
            ).fetchall()
            if row[0].endswith(worker_id[-20:])
        ]

    for round_ in range(3):
        wait_for(
            lambda: any(name.startswith("pgqueue listener") for name in backends()),
            timeout=30,
            message="the listener to be connected",
        )
        names = backends()
        assert len(names) >= 2, names
        observer.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = ANY(%s)",
            [names],
        )
        store.enqueue_many(
            [JobSpec("tests.tasks.ledger_sleep", kwargs={"seconds": 0.01}) for _ in range(50)]
        )
        # The poll interval is 30s: only a re-LISTENed connection wakes it this fast.
        expected = {"succeeded": 150 + 50 * round_}
        wait_for(
            lambda expected=expected: _status_counts(observer) == expected,
            timeout=60,
            message=f"all jobs to succeed after round {round_}",
        )
    assert "listener connection lost" in worker.output()


# ---------------------------------------------------------------- server restarts
@pytest.fixture
def restartable_database() -> Iterator[str]:
    """A migrated database on the suite's own embedded server."""
    server = embedded_server()
    name = f"pgq_faults_{uuid.uuid4().hex[:8]}"
    admin_url = server.url()
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = with_dbname(admin_url, name)
    subprocess.run(
        [sys.executable, "-m", "tests.manage", "migrate", "--noinput", "-v0"],
        cwd=REPO,
        env={**os.environ, "DATABASE_URL": url},
        check=True,
        timeout=120,
    )
    try:
        yield url
    finally:
        # The restarts broke this process's other connections too: let Django reconnect.
        connections.close_all()
        with psycopg.connect(server.url(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _enqueue(url: str, specs: list[JobSpec]) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        QueueStore(PsycopgRunner(conn, "default")).enqueue_many(specs)


@pytest.mark.server_control
@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_server_restart_mid_run_loses_nothing_and_strands_nothing(restartable_database, mode):
    url = restartable_database
    server = embedded_server()
    _enqueue(
        url, [JobSpec("tests.tasks.ledger_sleep", kwargs={"seconds": 0.02}) for _ in range(300)]
    )
    worker = WorkerProcess(
        url,
        "--lease-seconds",
        "2",
        "--poll-interval",
        "0.2",
        "--concurrency",
        "4",
        settings=RECOVERY,
    )
    try:

        def progress() -> int:
            with psycopg.connect(url, autocommit=True) as conn:
                return _status_counts(conn).get("succeeded", 0)

        wait_for(lambda: progress() >= 30, timeout=60)
        server.restart(mode)
        try:
            wait_for(lambda: progress() == 300, timeout=120)
        except AssertionError as timed_out:
            # Intermittent in CI only (not reproduced locally, under load or not): say
            # where the jobs are stuck and what the worker logged, for the next look.
            raise AssertionError(
                f"not all jobs finished 120 s after a {mode} restart: "
                f"{_stuck_jobs(url)}\n--- worker output ---\n{worker.output()[-20000:]}"
            ) from timed_out
        with psycopg.connect(url, autocommit=True) as conn:
            assert _status_counts(conn) == {"succeeded": 300}
            # Every job ran to completion; the ones cut off by the restart ran again.
            finished = conn.execute(
                "SELECT count(DISTINCT job_id) FROM tests_ledgerentry WHERE event = 'end'"
            ).fetchone()[0]
            assert finished == 300
        # After the restart the worker is still serving: new work is picked up.
        _enqueue(url, [JobSpec("tests.tasks.noop") for _ in range(10)])
        wait_for(lambda: progress() == 310, timeout=60)
        assert worker.process.poll() is None, worker.output()
    finally:
        worker.stop()
