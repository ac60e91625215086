"""A worker's prepared statements survive a migration that adds a column under them.

The worker's connections prepare their statements. Once a column is added to a table a
prepared statement returns whole (the claim's ``RETURNING job.*``), the server refuses
that statement on every later run ("cached plan must not change result type"): before
the runner handled it, a running worker failed every claim until it was restarted, so a
migration adding a job column stopped the previous release's workers mid-deploy.
"""

from __future__ import annotations

import logging

import psycopg
import pytest

from django_pgqueue.store.pgconn import DEFAULT_PREPARE_THRESHOLD
from django_pgqueue.store.queue import QueueStore
from django_pgqueue.store.runners import PsycopgRunner
from django_pgqueue.store.sql import Query
from django_pgqueue.store.values import JobSpec
from tests.workers import WorkerProcess, wait_for

pytestmark = pytest.mark.timeout(120)

TABLE = "pgq_test_prepared"
WHOLE_ROWS = Query("whole_rows", "every row, every column", f"SELECT * FROM {TABLE}", "test")
ECHO = "tests.tasks.echo"
ONE = Query("one", "a constant", "SELECT 1 AS one", "test")


@pytest.fixture
def runner(open_connection):
    setup = open_connection()
    setup.execute(f"CREATE TABLE {TABLE} (id integer)")
    setup.execute(f"INSERT INTO {TABLE} VALUES (1)")
    runner = PsycopgRunner(open_connection(), "default")
    for _ in range(DEFAULT_PREPARE_THRESHOLD + 1):
        runner.run(WHOLE_ROWS, {})  # prepared by now
    yield runner, setup
    setup.execute(f"DROP TABLE {TABLE}")


def _add_column(setup: psycopg.Connection) -> None:
    setup.execute(f"ALTER TABLE {TABLE} ADD COLUMN added integer DEFAULT 7")


def test_a_statement_prepared_before_a_column_was_added_runs_again(runner, caplog):
    runner, setup = runner
    _add_column(setup)
    with caplog.at_level(logging.INFO, logger="django_pgqueue.worker"):
        result = runner.run(WHOLE_ROWS, {})
    assert result.columns == ("id", "added")
    assert result.rows == [(1, 7)]
    assert "preparing anew" in caplog.text
    # Prepared again, and it stays usable.
    assert runner.run(WHOLE_ROWS, {}).rows == [(1, 7)]


def test_a_pipeline_meeting_a_stale_statement_runs_again(runner):
    runner, setup = runner
    _add_column(setup)
    first, second = runner.run_many([(ONE, {}), (WHOLE_ROWS, {})])
    assert first.rows == [(1,)]
    assert second.rows == [(1, 7)]


def test_inside_a_transaction_the_error_stands_and_the_next_statement_prepares_anew(runner):
    runner, setup = runner
    _add_column(setup)
    # The stale statement aborted the transaction: it cannot be run again inside it.
    with pytest.raises(psycopg.errors.FeatureNotSupported), runner.atomic():
        runner.run(WHOLE_ROWS, {})
    assert runner.run(WHOLE_ROWS, {}).rows == [(1, 7)]


def test_another_unsupported_feature_is_not_retried(open_connection):
    runner = PsycopgRunner(open_connection(), "default")
    unsupported = Query(
        "unsupported",
        "a feature-not-supported error from elsewhere",
        "DO $$ BEGIN RAISE EXCEPTION 'no' USING ERRCODE = '0A000'; END $$",
        "test",
    )
    with pytest.raises(psycopg.errors.FeatureNotSupported):
        runner.run(unsupported, {})


def test_enqueue_statements_keep_their_result_columns_when_a_job_column_is_added(
    open_connection, caplog
):
    """Producers whose Django connection prepares (``server_side_binding`` and a
    ``prepare_threshold`` in ``OPTIONS``) prepare the enqueue statements too, and there
    nothing can prepare anew: the error would abort the caller's transaction. So their
    results name the job's columns (the runner here would log if they did not)."""
    conn = open_connection()
    store = QueueStore(PsycopgRunner(open_connection(), "default"))

    def every_kind(round_: int) -> None:
        store.enqueue(JobSpec(ECHO, kwargs={"round": round_}))
        store.enqueue(JobSpec(ECHO, idempotency_key=f"prepared-{round_}"))
        # Taken: the holder is read back.
        assert not store.enqueue(JobSpec(ECHO, idempotency_key=f"prepared-{round_}")).created
        store.enqueue(JobSpec(ECHO, coalesce_key="prepared"))
        store.enqueue_many([JobSpec(ECHO), JobSpec(ECHO, idempotency_key=f"many-{round_}")])

    for round_ in range(DEFAULT_PREPARE_THRESHOLD + 1):
        every_kind(round_)
    conn.execute("ALTER TABLE django_pgqueue_job ADD COLUMN pgq_test_added integer")
    try:
        with caplog.at_level(logging.INFO, logger="django_pgqueue.worker"):
            every_kind(99)
    finally:
        conn.execute("ALTER TABLE django_pgqueue_job DROP COLUMN pgq_test_added")
    assert "preparing anew" not in caplog.text


def _succeeded(conn: psycopg.Connection, label: str) -> int:
    return conn.execute(
        "SELECT count(*) FROM django_pgqueue_job_all WHERE status = 'succeeded' "
        "AND kwargs ->> 'label' = %s",
        [label],
    ).fetchone()[0]


def test_a_running_worker_keeps_claiming_after_a_column_is_added_to_the_job_table(
    db_url, open_connection
):
    conn = open_connection()
    producer = QueueStore(PsycopgRunner(open_connection(), "default"))

    def enqueue(label: str, count: int) -> None:
        producer.enqueue_many([JobSpec(ECHO, kwargs={"label": label}) for _ in range(count)])

    worker = WorkerProcess(db_url, "--queue", "default", "--concurrency", "2")
    try:
        worker.wait_registered(conn)
        # Enough claims, completions and fetches for every statement to be prepared.
        for round_ in range(5):
            enqueue(f"before-{round_}", 20)
            wait_for(
                lambda label=f"before-{round_}": _succeeded(conn, label) == 20,
                timeout=60,
                message=f"the worker to run the first jobs\n{worker.output()}",
            )
        conn.execute("ALTER TABLE django_pgqueue_job ADD COLUMN pgq_test_added integer")
        try:
            enqueue("after", 50)
            wait_for(
                lambda: _succeeded(conn, "after") == 50,
                timeout=60,
                message=f"the worker to run jobs after the column was added\n{worker.output()}",
            )
            assert worker.process.poll() is None, worker.output()
        finally:
            conn.execute("ALTER TABLE django_pgqueue_job DROP COLUMN pgq_test_added")
        output = worker.output()
        assert "Traceback" not in output
        # The worker's statements name their columns: none even needed preparing anew.
        assert "preparing anew" not in output
    finally:
        worker.stop()
