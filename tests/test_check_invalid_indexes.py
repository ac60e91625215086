"""Check W002: any INVALID index on the queue's tables, whoever left it, and its repair.

Run by ``check --database`` (and before ``migrate``) and at worker start; silent once the
command it names has run; never fails for an unreachable database or a build under way.
"""

from __future__ import annotations

import threading
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connections

from django_pgqueue import checks as pgqueue_checks
from django_pgqueue.store.schema import queue_tables
from tests.admin_fixtures import login, url
from tests.indexes import (
    JOB_TABLE,
    break_unique_index,
    cancel_while_waiting_for_writers,
    seed_finished_jobs,
    validity,
)
from tests.workers import WorkerProcess, wait_for

pytestmark = [pytest.mark.timeout(60), pytest.mark.django_db(transaction=True)]

BROKEN = "pgq_test_broken"


@pytest.fixture
def conn(observer):
    """The observer connection; drops the test's indexes at teardown, whatever happened."""
    yield observer
    for name in (BROKEN, "pgq_job_revivable_ccnew"):
        observer.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "{name}"')


def _w002():
    return pgqueue_checks.check_invalid_indexes(databases=["default"])


def test_the_tables_come_from_the_app_models():
    assert sorted(queue_tables()) == [
        "django_pgqueue_coalesce_key",
        "django_pgqueue_concurrency",
        "django_pgqueue_concurrency_signal",
        "django_pgqueue_dependency",
        "django_pgqueue_job",
        "django_pgqueue_job_history",
        "django_pgqueue_job_key",
        "django_pgqueue_partition",
        "django_pgqueue_partition_signal",
        "django_pgqueue_queue_pause",
        "django_pgqueue_queuestat",
        "django_pgqueue_schedule",
        "django_pgqueue_sql_settings",
        "django_pgqueue_worker",
    ]


def test_w002_names_the_index_and_the_statement_that_repairs_it(conn, client):
    assert _w002() == []
    seed_finished_jobs(conn, 2)
    break_unique_index(conn, BROKEN)

    messages = _w002()
    assert [message.id for message in messages] == ["django_pgqueue.W002"]
    assert f"'{BROKEN}' on {JOB_TABLE}" in messages[0].msg
    assert "INVALID" in messages[0].msg
    repair = f'REINDEX INDEX CONCURRENTLY "public"."{BROKEN}";'
    assert messages[0].hint == f"Repair it with: {repair}"

    # The lag page lists it, with the same repair.
    login(client, superuser=True)
    page = client.get(url("django_pgqueue_lag"))
    assert [problem.index.index_name for problem in page.context["invalid_indexes"]] == [BROKEN]
    assert f'data-index="{BROKEN}"' in page.text
    assert "REINDEX INDEX CONCURRENTLY" in page.text

    duplicate = conn.execute(f"SELECT min(id) FROM {JOB_TABLE}").fetchone()[0]
    conn.execute(f"DELETE FROM {JOB_TABLE} WHERE id = %s", [duplicate])
    conn.execute(repair.rstrip(";"))
    assert validity(conn, BROKEN) is True
    assert _w002() == []
    assert client.get(url("django_pgqueue_lag")).context["invalid_indexes"] == []


def test_w002_reports_the_leftover_of_an_interrupted_reindex(conn, open_connection):
    cancel_while_waiting_for_writers(
        open_connection, "REINDEX INDEX CONCURRENTLY pgq_job_revivable"
    )
    assert validity(conn, "pgq_job_revivable") is True  # the original is still in use
    assert validity(conn, "pgq_job_revivable_ccnew") is False

    messages = _w002()
    assert [message.id for message in messages] == ["django_pgqueue.W002"]
    assert "'pgq_job_revivable_ccnew'" in messages[0].msg
    assert "REINDEX CONCURRENTLY" in messages[0].msg
    repair = 'DROP INDEX CONCURRENTLY IF EXISTS "public"."pgq_job_revivable_ccnew";'
    assert messages[0].hint == f"Repair it with: {repair}"

    conn.execute(repair)
    assert _w002() == []


def test_w002_is_printed_by_check_with_database(conn):
    seed_finished_jobs(conn, 2)
    break_unique_index(conn, BROKEN)
    out, err = StringIO(), StringIO()
    call_command("check", "--database", "default", stdout=out, stderr=err)
    assert "(django_pgqueue.W002)" in err.getvalue()
    assert BROKEN in err.getvalue()

    err = StringIO()
    call_command("check", stdout=out, stderr=err)  # without --database: no connection
    assert "W002" not in err.getvalue()


def test_w002_is_printed_when_a_worker_starts(conn, workers):
    seed_finished_jobs(conn, 2)
    break_unique_index(conn, BROKEN)
    worker = workers("--burst")
    assert worker.wait() == 0
    output = worker.output()
    assert "(django_pgqueue.W002)" in output
    assert f'REINDEX INDEX CONCURRENTLY "public"."{BROKEN}";' in output


def test_w002_is_silent_while_a_build_is_under_way(conn, open_connection):
    writer = open_connection(prepare=False)
    writer.execute("BEGIN")
    writer.execute(f"LOCK TABLE {JOB_TABLE} IN ROW EXCLUSIVE MODE")
    builder = open_connection(prepare=False)
    done = threading.Event()

    def build():
        builder.execute(f"CREATE INDEX CONCURRENTLY {BROKEN} ON {JOB_TABLE} (queue)")
        done.set()

    thread = threading.Thread(target=build, daemon=True)
    thread.start()
    try:
        wait_for(lambda: validity(conn, BROKEN) is False, timeout=20, message="the build")
        assert _w002() == []
    finally:
        writer.execute("ROLLBACK")
    assert done.wait(20)
    assert validity(conn, BROKEN) is True


@pytest.fixture
def unreachable():
    """Point the default alias at a port nothing listens on, for one test."""
    connection = connections["default"]
    port = connection.settings_dict["PORT"]
    connection.close()
    connection.settings_dict["PORT"] = 9
    yield "default"
    connection.close()
    connection.settings_dict["PORT"] = port


def test_w002_does_not_fail_when_the_database_is_unreachable(unreachable):
    from django.db import OperationalError

    with pytest.raises(OperationalError):
        connections[unreachable].ensure_connection()
    assert pgqueue_checks.check_invalid_indexes(databases=[unreachable]) == []


def test_a_worker_starting_without_its_database_waits_for_it_instead_of_failing_a_check():
    worker = WorkerProcess("postgresql://postgres@127.0.0.1:9/pgq_unreachable")
    try:
        wait_for(
            lambda: "cannot reach the database" in worker.output(),
            timeout=30,
            message="the worker to report the unreachable database",
        )
        assert worker.process.poll() is None
        assert "Traceback" not in worker.output()
    finally:
        worker.stop()
