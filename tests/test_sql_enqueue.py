"""Enqueue from SQL: django_pgqueue_enqueue() checks and defaults as Python does.

Real PostgreSQL: the function called on a plain psycopg connection (as psql, a trigger
or another language would), its typed errors, its wake-ups, the settings row that
migrate and workers write, and a worker running what SQL enqueued.
"""

from __future__ import annotations

import zlib

import psycopg
import pytest
from django.test import override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_pgqueue.conf import conf
from django_pgqueue.models import Job, SqlSettings
from django_pgqueue.store.partition import bucket_for
from django_pgqueue.store.values import JobSpec
from django_pgqueue.tasks.sqlsync import sync_sql_settings
from tests.workers import wait_for

pytestmark = pytest.mark.timeout(120)

QUEUES = ["default", "emails", "high", "low", "reports"]


def _enqueue(conn, *args, **kwargs):
    """Call the function with positional and named arguments, as SQL would."""
    names = [f"{name} => %({name})s" for name in kwargs]
    placeholders = [f"%(p{index})s" for index in range(len(args))]
    params = {f"p{index}": value for index, value in enumerate(args)} | kwargs
    sql = f"SELECT django_pgqueue_enqueue({', '.join(placeholders + names)})"
    return conn.execute(sql, params).fetchone()[0]


def _error(conn, *args, **kwargs) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as raised:
        _enqueue(conn, *args, **kwargs)
    conn.rollback()
    return raised.value


@pytest.fixture
def sql(open_connection):
    """A connection in a transaction of its own, as a psql session or a service has."""
    conn = open_connection()
    conn.autocommit = False
    return conn


def test_migrate_wrote_the_settings_the_function_reads(db_url):
    row = SqlSettings.objects.get()
    assert row.queues == QUEUES
    assert (row.max_attempts, row.max_payload_bytes) == (
        conf.MAX_ATTEMPTS,
        conf.MAX_PAYLOAD_BYTES,
    )
    assert row.notify_channel == conf.NOTIFY_CHANNEL
    assert row.synced_by == "migrate"


def test_a_job_enqueued_from_sql_has_pythons_defaults_and_a_worker_runs_it(sql, workers):
    job_id = _enqueue(sql, "tests.tasks.add", args="[2, 3]")
    sql.commit()
    job = Job.objects.get(pk=job_id)
    python = Job.objects.enqueue("tests.tasks.add", args=[2, 3])
    for field in ("queue", "priority", "max_attempts", "status", "attempts", "kwargs"):
        assert getattr(job, field) == getattr(python, field), field
    assert job.args == [2, 3]
    worker = workers("--burst")
    assert worker.wait() == 0, worker.output()
    assert Job.objects.get(pk=job_id).result == 5
    row = SqlSettings.objects.get()
    assert row.synced_by.startswith("runqueueworker pid ")


def test_named_arguments_set_queue_priority_time_and_attempts(sql, observer):
    now = observer.execute("SELECT now()").fetchone()[0]
    job_id = _enqueue(
        sql,
        "tests.tasks.echo",
        kwargs='{"a": 1}',
        queue="emails",
        priority=50,
        run_after=now.replace(year=now.year + 1),
        max_attempts=9,
    )
    sql.commit()
    job = Job.objects.get(pk=job_id)
    assert (job.queue, job.priority, job.max_attempts, job.kwargs) == ("emails", 50, 9, {"a": 1})
    assert job.available_at.year == now.year + 1


@pytest.mark.parametrize(
    ("call", "sqlstate", "text"),
    [
        ({"queue": "nope"}, "QJ001", "queue 'nope': not one of the queues of this database"),
        ({"priority": 101}, "QJ002", "priority: 101 is outside -100..100"),
        ({"max_attempts": 0}, "QJ002", "max_attempts: 0 is outside 1..1000"),
        ({"args": '{"a": 1}'}, "QJ003", "args: must be a JSON array, not object"),
        ({"kwargs": "[1]"}, "QJ003", "kwargs: must be a JSON object, not array"),
        ({"idempotency_key": ""}, "QJ002", "idempotency_key: must be NULL or 1 to 255"),
        ({"partition_key": "x" * 256}, "QJ002", "partition_key: must be NULL or 1 to 255"),
        ({"queue": ""}, "QJ002", "queue: must be a non-empty string"),
    ],
)
def test_bad_input_is_a_typed_error_and_writes_nothing(sql, call, sqlstate, text):
    error = _error(sql, "tests.tasks.noop", **call)
    assert error.sqlstate == sqlstate
    assert text in str(error)
    assert Job.objects.count() == 0


def test_an_empty_task_path_is_refused(sql):
    error = _error(sql, "")
    assert (error.sqlstate, "task_path: must be a non-empty string" in str(error)) == (
        "QJ002",
        True,
    )


def test_unknown_queue_lists_the_queues_and_says_what_to_do(sql):
    error = _error(sql, "tests.tasks.noop", queue="nope")
    assert error.diag.message_detail == "queues: " + ", ".join(QUEUES)
    assert "QUEUES" in (error.diag.message_hint or "")


def test_an_oversize_payload_is_refused_with_the_limit(sql, db_url):
    with override_settings(PGQUEUE_MAX_PAYLOAD_BYTES=100):
        sync_sql_settings("default", synced_by="test")
    try:
        error = _error(sql, "tests.tasks.echo", args=psycopg.types.json.Jsonb(["x" * 200]))
        assert error.sqlstate == "QJ004"
        assert "over the limit of 100 bytes" in str(error)
        assert Job.objects.count() == 0
    finally:
        sync_sql_settings("default", synced_by="test")


def test_without_the_settings_row_the_function_says_to_migrate(sql, db_url):
    SqlSettings.objects.all().delete()
    try:
        error = _error(sql, "tests.tasks.noop")
        assert error.sqlstate == "QJ000"
        assert "manage.py migrate" in (error.diag.message_hint or "")
    finally:
        sync_sql_settings("default", synced_by="test")


def test_an_idempotency_key_returns_the_job_already_holding_it(sql):
    first = _enqueue(sql, "tests.tasks.noop", idempotency_key="order-1")
    sql.commit()
    assert _enqueue(sql, "tests.tasks.noop", idempotency_key="order-1") == first
    python = Job.objects.enqueue("tests.tasks.noop", idempotency_key="order-1")
    assert python.pk == first
    assert Job.objects.count() == 1


def test_the_enqueue_is_part_of_the_callers_transaction(sql):
    _enqueue(sql, "tests.tasks.noop")
    sql.rollback()
    assert Job.objects.count() == 0


@given(key=st.text(min_size=1, max_size=60))
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_the_crc32_function_is_zlibs(sql, key):
    encoded = key.encode("utf-8", "surrogatepass")
    value = sql.execute("SELECT django_pgqueue_crc32(%s::bytea)", [encoded]).fetchone()[0]
    sql.rollback()
    assert value == zlib.crc32(encoded)


def test_a_partitioned_job_gets_pythons_bucket_and_order(sql, store):
    ids = [_enqueue(sql, "tests.tasks.noop", partition_key="tenant-é") for _ in range(3)]
    sql.commit()
    jobs = Job.objects.filter(pk__in=ids).order_by("id")
    assert {job.partition_bucket for job in jobs} == {bucket_for("tenant-é")}
    # One at a time, in order: the claim sees the partition through the SQL's signal.
    (first,) = store.claim("w", ["default"], per_queue=10, lease_seconds=30)
    assert first.id == ids[0]
    assert store.claim("w", ["default"], per_queue=10, lease_seconds=30) == []


def test_limits_in_settings_apply_as_in_python(sql, db_url):
    with override_settings(
        PGQUEUE_CONCURRENCY_LIMITS={"queue:low": 2},
        PGQUEUE_RATE_LIMITS={"task:tests.tasks.add": "5/10s"},
    ):
        sync_sql_settings("default", synced_by="test")
        python_low = Job.objects.enqueue("tests.tasks.noop", queue="low")
        python_add = Job.objects.enqueue("tests.tasks.add", args=[1, 2])
    try:
        low_id = _enqueue(sql, "tests.tasks.noop", queue="low")
        add_id = _enqueue(sql, "tests.tasks.add", args="[1, 2]")
        sql.commit()
        low, add = Job.objects.get(pk=low_id), Job.objects.get(pk=add_id)
        columns = ("concurrency_key", "concurrency_limit", "rate_limit", "rate_period")
        for ours, theirs in ((low, python_low), (add, python_add)):
            assert [getattr(ours, c) for c in columns] == [getattr(theirs, c) for c in columns]
        assert (low.concurrency_key, low.concurrency_limit) == ("queue:low", 2)
        assert (add.rate_limit, add.rate_period) == (5, 10.0)
    finally:
        sync_sql_settings("default", synced_by="test")


def test_a_sql_enqueue_wakes_the_queues_workers_at_commit(sql, open_connection):
    listener = open_connection()
    listener.execute(f'LISTEN "{conf.NOTIFY_CHANNEL}"')
    _enqueue(sql, "tests.tasks.noop", queue="emails")
    assert list(listener.notifies(timeout=0.2)) == []  # nothing before the commit
    sql.commit()
    received = wait_for(
        lambda: [n.payload for n in listener.notifies(timeout=0.5, stop_after=1)],
        timeout=10,
        message="the wake-up of a SQL enqueue",
    )
    assert received == ["emails"]
    # A job for later wakes nobody now.
    _enqueue(sql, "tests.tasks.noop", run_after="2999-01-01T00:00:00Z")
    sql.commit()
    assert list(listener.notifies(timeout=0.5)) == []


def test_a_trigger_enqueues_in_the_transaction_that_fired_it(sql):
    sql.execute(
        """
        CREATE FUNCTION tests_order_enqueue() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM django_pgqueue_enqueue(
                'tests.tasks.send_receipt',
                args => jsonb_build_array(NEW.job_id),
                queue => 'emails'
            );
            RETURN NEW;
        END $$;
        CREATE TRIGGER tests_order_enqueue AFTER INSERT ON tests_order
            FOR EACH ROW EXECUTE FUNCTION tests_order_enqueue();
        """
    )
    sql.execute("INSERT INTO tests_order (job_id, note) VALUES (41, '')")
    sql.commit()
    (job,) = Job.objects.all()
    assert (job.task_path, job.args, job.queue) == ("tests.tasks.send_receipt", [41], "emails")
    sql.execute("DROP TRIGGER tests_order_enqueue ON tests_order")
    sql.execute("DROP FUNCTION tests_order_enqueue()")
    sql.commit()


def test_store_and_sql_enqueues_mix_in_one_queue(sql, store):
    python = store.enqueue(JobSpec("tests.tasks.noop")).id
    from_sql = _enqueue(sql, "tests.tasks.noop")
    sql.commit()
    claimed = store.claim("w", ["default"], per_queue=10, lease_seconds=30)
    assert sorted(job.id for job in claimed) == sorted([python, from_sql])
