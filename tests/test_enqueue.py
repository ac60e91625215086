"""Enqueueing: transactional visibility, wake-up notifications, bulk inserts."""

from __future__ import annotations

import datetime as dt
import threading
import time

import pytest
from django.db import connection, connections, transaction
from django.db.backends.postgresql.base import DatabaseWrapper
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_pgqueue.conf import conf
from django_pgqueue.exceptions import ConfigurationError, PayloadTooLarge
from django_pgqueue.models import Job
from django_pgqueue.states import JobStatus
from django_pgqueue.store.partition import bucket_for
from django_pgqueue.store.values import JobSpec

pytestmark = pytest.mark.timeout(60)


def _listen(conn, channel=None):
    conn.execute(f"LISTEN {channel or conf.NOTIFY_CHANNEL}")


def _drain_notifies(conn, wait=0.5):
    """Collect notifications that arrive within ``wait`` seconds."""
    received = []
    deadline = time.monotonic() + wait
    while (remaining := deadline - time.monotonic()) > 0:
        for notify in conn.notifies(timeout=remaining, stop_after=1):
            received.append(notify.payload)
    return received


def test_enqueue_returns_a_pending_job_with_defaults(db):
    job = Job.objects.enqueue("tests.tasks.add", args=[1, 2], kwargs={"x": "y"})
    job.refresh_from_db()
    assert job.status == JobStatus.PENDING
    assert (job.queue, job.task_path, job.args, job.kwargs) == (
        "default",
        "tests.tasks.add",
        [1, 2],
        {"x": "y"},
    )
    assert job.attempts == 0
    assert job.max_attempts == conf.MAX_ATTEMPTS
    assert job.lease_generation == 0
    assert job.errors == []
    assert job.available_at is not None
    assert job.created_at is not None
    assert job.partition_bucket is None


def test_partition_bucket_is_the_stable_hash_of_the_key(db):
    job = Job.objects.enqueue("tests.tasks.noop", partition_key="customer:42")
    assert job.partition_bucket == bucket_for("customer:42")


def test_rolled_back_enqueue_leaves_nothing(db_url, open_connection):
    class Boom(Exception):
        pass

    with pytest.raises(Boom), transaction.atomic():
        Job.objects.enqueue("tests.tasks.noop")
        raise Boom
    observer = open_connection()
    assert observer.execute("SELECT count(*) FROM django_pgqueue_job_all").fetchone()[0] == 0


def test_job_is_invisible_to_other_connections_until_commit(db_url, open_connection):
    observer = open_connection()
    with transaction.atomic():
        job = Job.objects.enqueue("tests.tasks.noop")
        seen = observer.execute(
            "SELECT count(*) FROM django_pgqueue_job_all WHERE id = %s", [job.pk]
        ).fetchone()[0]
        assert seen == 0
    seen = observer.execute(
        "SELECT count(*) FROM django_pgqueue_job_all WHERE id = %s", [job.pk]
    ).fetchone()[0]
    assert seen == 1


def test_one_notification_per_transaction_and_queue_without_payload(db_url, open_connection):
    listener = open_connection()
    _listen(listener)
    with transaction.atomic():
        for index in range(50):
            Job.objects.enqueue("tests.tasks.add", args=[index, 1])
        Job.objects.store().enqueue_many(
            [JobSpec("tests.tasks.noop", queue="emails") for _ in range(100)]
        )
        assert _drain_notifies(listener, wait=0.2) == []  # nothing before COMMIT
    received = _drain_notifies(listener)
    assert sorted(received) == ["default", "emails"]


def test_scheduled_jobs_do_not_wake_workers(db_url, open_connection):
    listener = open_connection()
    _listen(listener)
    later = timezone.now() + dt.timedelta(hours=1)
    Job.objects.enqueue("tests.tasks.noop", available_at=later)
    assert _drain_notifies(listener) == []


def test_enqueue_many_inserts_thousands_in_one_statement(db):
    specs = [
        JobSpec("tests.tasks.add", args=[index, index], priority=index % 7) for index in range(5000)
    ]
    with CaptureQueriesContext(connection) as queries:
        jobs = Job.objects.enqueue_many(specs)
    assert len(queries.captured_queries) == 1
    # No job has an idempotency key, so nothing can conflict: no speculative insertion.
    assert "ON CONFLICT" not in queries.captured_queries[0]["sql"]
    assert len(jobs) == 5000
    assert [job.args for job in jobs] == [[index, index] for index in range(5000)]
    assert len({job.pk for job in jobs}) == 5000
    assert Job.objects.count() == 5000


def test_enqueue_many_resolves_keys_within_the_batch_and_against_existing_jobs(db):
    existing = Job.objects.enqueue("tests.tasks.noop", idempotency_key="old")
    with CaptureQueriesContext(connection) as queries:
        outcomes = Job.objects.store().enqueue_many(
            [
                JobSpec("tests.tasks.noop", idempotency_key="new"),
                JobSpec("tests.tasks.noop"),
                JobSpec("tests.tasks.noop", idempotency_key="old"),
                JobSpec("tests.tasks.noop", idempotency_key="new"),
                JobSpec("tests.tasks.noop"),
            ]
        )
    # One statement: the trigger taking each key skips the taken ones (no ON CONFLICT:
    # migration 0026).
    assert len(queries.captured_queries) == 2  # the insert, then the taken keys' jobs
    assert "ON CONFLICT" not in queries.captured_queries[0]["sql"]
    assert [outcome.created for outcome in outcomes] == [True, True, False, False, True]
    assert outcomes[2].job.pk == existing.pk
    assert outcomes[3].job.pk == outcomes[0].job.pk
    assert Job.objects.count() == 4


@pytest.mark.parametrize("keyed", [False, True], ids=["unkeyed", "keyed"])
def test_enqueue_many_returns_each_jobs_id_and_times_as_stored(db, keyed):
    # The statement answers with arrays, and leaves out the available times when every
    # job runs now: each outcome must still carry its own row's values, in input order.
    Job.objects.enqueue("tests.tasks.noop", idempotency_key="taken")
    soon = timezone.now() + dt.timedelta(minutes=5)
    past = timezone.now() - dt.timedelta(days=1)
    specs = [
        JobSpec(
            "tests.tasks.add",
            args=[index, 0],
            available_at=[None, soon, past][index % 3] if index < 60 else None,
            idempotency_key=("taken" if index == 7 else f"k{index}") if keyed else None,
        )
        for index in range(90)
    ]
    outcomes = Job.objects.store().enqueue_many(specs)
    rows = {job.pk: job for job in Job.objects.filter(task_path="tests.tasks.add")}
    for index, outcome in enumerate(outcomes):
        job = outcome.snapshot
        if keyed and index == 7:
            assert not outcome.created
            continue
        stored = rows[job.id]
        assert outcome.created
        assert job.args == stored.args == [index, 0]
        assert (job.created_at, job.available_at) == (stored.created_at, stored.available_at)
    created = [outcome.snapshot.created_at for outcome in outcomes if outcome.created]
    assert len(set(created)) == 1  # one statement, one transaction time
    all_now = Job.objects.store().enqueue_many([JobSpec("tests.tasks.noop") for _ in range(3)])
    assert all(o.snapshot.available_at == o.snapshot.created_at for o in all_now)


def test_concurrent_bulk_enqueues_pair_each_job_with_its_own_id(transactional_db):
    # Two sessions inserting at once interleave their sequence values: each statement's
    # ids must still come back in its own input order, or results name the wrong jobs.
    barrier = threading.Barrier(3)
    outcomes: dict[int, list] = {}
    errors: list[BaseException] = []

    def insert(producer: int) -> None:
        try:
            specs = [JobSpec("tests.tasks.add", args=[producer, index]) for index in range(2000)]
            barrier.wait(10)
            for _ in range(3):
                outcomes.setdefault(producer, []).extend(Job.objects.store().enqueue_many(specs))
        except BaseException as error:  # reported below, not lost in the thread
            errors.append(error)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=insert, args=(producer,)) for producer in (1, 2)]
    for thread in threads:
        thread.start()
    barrier.wait(10)
    for thread in threads:
        thread.join(30)
    assert not errors
    stored = dict(Job.objects.values_list("id", "args"))
    assert len(stored) == 12000
    for producer, made in outcomes.items():
        assert [stored[outcome.id] for outcome in made] == [
            [producer, index] for index in range(2000)
        ] * 3


def test_enqueue_many_of_nothing_runs_no_query(db):
    with CaptureQueriesContext(connection) as queries:
        assert Job.objects.enqueue_many([]) == []
    assert queries.captured_queries == []


def test_run_after_sets_available_at(db):
    when = timezone.now() + dt.timedelta(minutes=5)
    job = Job.objects.enqueue("tests.tasks.noop", available_at=when)
    assert job.available_at == when


def test_enqueue_reads_changed_settings_and_refuses_invalid_ones_every_time(db):
    # The settings an enqueue reads are cached until Django says one changed.
    assert Job.objects.enqueue("tests.tasks.noop").max_attempts == conf.MAX_ATTEMPTS
    with override_settings(PGQUEUE_MAX_ATTEMPTS=7, PGQUEUE_MAX_PAYLOAD_BYTES=64):
        assert Job.objects.enqueue("tests.tasks.noop").max_attempts == 7
        with pytest.raises(PayloadTooLarge):
            Job.objects.enqueue("tests.tasks.noop", args=["x" * 100])
    assert Job.objects.enqueue("tests.tasks.noop", args=["x" * 100]).max_attempts == (
        conf.MAX_ATTEMPTS
    )
    with override_settings(PGQUEUE_RATE_LIMITS={"queue:default": "fast"}):
        for _ in range(2):  # an invalid value is never cached: it fails each time
            with pytest.raises(ConfigurationError, match="PGQUEUE_RATE_LIMITS"):
                Job.objects.enqueue("tests.tasks.noop")
    with override_settings(PGQUEUE_RATE_LIMITS={"queue:default": "5/s"}):
        limited = Job.objects.enqueue("tests.tasks.noop")
    unlimited = Job.objects.enqueue("tests.tasks.noop")
    limited.refresh_from_db()
    unlimited.refresh_from_db()
    assert (limited.concurrency_key, limited.rate_limit) == ("queue:default", 5)
    assert (unlimited.concurrency_key, unlimited.rate_limit) == (None, None)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"partition_key": "customer:7", "idempotency_key": "order-7"},
        {"coalesce_key": "digest:7", "debounce": 30},
        {"queue": "limited", "priority": 5, "max_attempts": 4},
    ],
    ids=["plain", "partitioned", "coalesced", "rate-limited"],
)
def test_the_returned_job_equals_the_stored_row_in_every_field(db, options):
    limits = {"PGQUEUE_RATE_LIMITS": {"queue:limited": "5/s"}}
    with override_settings(**limits), transaction.atomic():
        returned = [
            Job.objects.enqueue("tests.tasks.noop", args=[1], **options),
            *Job.objects.enqueue_many(
                [JobSpec(task_path="tests.tasks.noop", args=[2], traceparent=_TRACEPARENT)]
            ),
        ]
    for job in returned:
        stored = Job.objects.get(pk=job.pk)
        fields = [f.attname for f in Job._meta.concrete_fields]
        assert {name: getattr(job, name) for name in fields} == {
            name: getattr(stored, name) for name in fields
        }
    if options:
        assert returned[0].queue == options.get("queue", "default")
        assert returned[0].concurrency_key == ("queue:limited" if "queue" in options else None)
    assert returned[1].traceparent == _TRACEPARENT


_TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class _Rollback(Exception):
    pass


def test_with_djangos_opt_in_the_enqueue_statement_is_prepared(db):
    # What the performance docs suggest for enqueueing: Django's own switches for
    # server-side binding and prepared statements, honoured by our statements.
    settings_dict = {
        **connection.settings_dict,
        "OPTIONS": {
            **connection.settings_dict["OPTIONS"],
            "server_side_binding": True,
            "prepare_threshold": 2,
        },
    }
    wrapper = DatabaseWrapper(settings_dict, alias=connection.alias)
    original = connections[connection.alias]
    connections[connection.alias] = wrapper
    try:
        with pytest.raises(_Rollback), transaction.atomic():
            jobs = [Job.objects.enqueue("tests.tasks.noop", args=[n]) for n in range(3)]
            with wrapper.cursor() as cursor:
                cursor.execute("SELECT statement FROM pg_prepared_statements WHERE NOT from_sql")
                prepared = [row[0] for row in cursor.fetchall()]
            raise _Rollback
    finally:
        connections[connection.alias] = original
        wrapper.close()
    assert [job.args for job in jobs] == [[0], [1], [2]]
    assert any(text.lstrip().startswith("INSERT INTO django_pgqueue_job") for text in prepared)
    assert not Job.objects.filter(pk__in=[job.pk for job in jobs]).exists()
