"""Coalescing: one pending job per coalesce key, even under concurrent enqueues."""

from __future__ import annotations

import datetime as dt
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connections, transaction

from django_pgqueue import InvalidOption
from django_pgqueue.models import HistoryJob, Job, LiveJob
from django_pgqueue.states import JobStatus
from django_pgqueue.store.values import JobSpec
from tests import tasks
from tests.workers import wait_for

pytestmark = pytest.mark.timeout(60)


def _spec(*args, **options):
    return JobSpec("tests.tasks.echo", args=args, coalesce_key="reindex:42", **options)


def test_a_second_enqueue_returns_the_pending_job_with_the_newest_arguments(store):
    first = store.enqueue(_spec(1))
    second = store.enqueue(_spec(2))
    assert first.created
    assert not second.created
    assert second.id == first.id
    assert second.snapshot.args == [2]
    assert second.snapshot.available_at == first.snapshot.available_at  # no debounce: kept
    assert Job.objects.get().args == [2]


def test_once_the_job_has_started_a_new_enqueue_makes_a_new_job(store):
    first = store.enqueue(_spec(1))
    (claimed,) = store.claim("w1", ["default"], per_queue=10, lease_seconds=30)
    assert claimed.id == first.id
    second = store.enqueue(_spec(2))
    assert second.created
    assert second.id != first.id
    assert store.enqueue(_spec(3)).id == second.id
    statuses = dict(Job.objects.values_list("id", "status"))
    assert statuses == {first.id: JobStatus.PROCESSING, second.id: JobStatus.PENDING}


def test_debounce_pushes_the_start_later_on_the_database_clock(store, observer):
    first = store.enqueue(_spec(1, debounce=dt.timedelta(seconds=5)))
    db_now = observer.execute("SELECT now()").fetchone()[0]
    assert dt.timedelta(seconds=4) < first.snapshot.available_at - db_now <= dt.timedelta(seconds=5)
    second = store.enqueue(_spec(2, debounce=dt.timedelta(seconds=60)))
    assert second.id == first.id
    db_now = observer.execute("SELECT now()").fetchone()[0]
    assert second.snapshot.available_at - db_now > dt.timedelta(seconds=59)
    # A shorter debounce never pulls the start earlier.
    third = store.enqueue(_spec(3, debounce=1))
    assert third.snapshot.available_at == second.snapshot.available_at
    assert store.claim("w1", ["default"], per_queue=10, lease_seconds=30) == []


def test_a_partitioned_coalesced_job_moved_later_is_not_claimed_early(store):
    spec = JobSpec("tests.tasks.echo", partition_key="p", coalesce_key="k")
    first = store.enqueue(spec)
    signal_count = "SELECT count(*) FROM django_pgqueue_partition_signal WHERE partition_key = 'p'"
    signals = store.runner.connection.execute(signal_count).fetchone()[0]
    assert signals == 1  # the insert's own
    moved = store.enqueue(JobSpec(**{**_fields(spec), "debounce": 60}))
    assert moved.id == first.id
    # The move signals the partition once (the trigger on available_at of migration
    # 0004), so its claim state is refreshed with the new time.
    assert store.runner.connection.execute(signal_count).fetchone()[0] == signals + 1
    assert store.claim("w1", ["default"], per_queue=10, lease_seconds=30) == []
    assert store.claim("w1", ["default"], per_queue=10, lease_seconds=30) == []  # folded


def _fields(spec):
    return {name: getattr(spec, name) for name in JobSpec.__dataclass_fields__}


def test_enqueue_many_resolves_a_shared_key_to_one_job(store):
    outcomes = store.enqueue_many(
        [_spec(1), JobSpec("tests.tasks.noop"), _spec(2), JobSpec("tests.tasks.noop")]
    )
    assert [outcome.created for outcome in outcomes] == [True, True, False, True]
    assert outcomes[0].id == outcomes[2].id
    assert len({outcome.id for outcome in outcomes}) == 3
    assert Job.objects.get(coalesce_key="reindex:42").args == [2]


def test_another_tasks_pending_job_holding_the_key_is_returned_unchanged(store):
    first = store.enqueue(_spec(1))
    other = store.enqueue(JobSpec("tests.tasks.noop", coalesce_key="reindex:42"))
    assert other.id == first.id
    assert not other.created
    assert Job.objects.get().args == [1]


def test_the_task_api_returns_the_existing_job(transactional_db):
    coalesced = tasks.echo.using(coalesce_key="reindex:7", debounce=dt.timedelta(seconds=5))
    first = coalesced.enqueue(1)
    second = coalesced.enqueue(2)
    assert second.id == first.id
    assert second.args == [2]
    assert Job.objects.count() == 1


def test_the_tasks_enqueue_many_with_a_coalesce_key_makes_one_job(transactional_db):
    results = tasks.echo.using(coalesce_key="reindex:9").enqueue_many(
        [([1], {}), ([2], {}), ([3], {})]
    )
    assert len({result.id for result in results}) == 1
    assert Job.objects.get().args == [3]


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({"coalesce_key": "k", "idempotency_key": "i"}, "coalesce_key"),
        ({"coalesce_key": "k", "debounce": -1}, "debounce"),
        ({"coalesce_key": "k", "debounce": dt.timedelta(seconds=-1)}, "debounce"),
        ({"coalesce_key": "k", "debounce": float("inf")}, "debounce"),
        ({"coalesce_key": "k", "debounce": dt.timedelta(days=2)}, "debounce"),
        ({"coalesce_key": "k", "debounce": "5s"}, "debounce"),
        ({"debounce": 5}, "debounce"),
        ({"coalesce_key": ""}, "coalesce_key"),
    ],
)
def test_bad_coalescing_options_are_typed_errors(transactional_db, options, option):
    with pytest.raises(InvalidOption) as raised:
        Job.objects.store().enqueue(JobSpec("tests.tasks.echo", **options))
    assert raised.value.option == option
    with pytest.raises(InvalidOption) as raised:
        tasks.echo.using(**options)
    assert raised.value.option == option
    assert Job.objects.count() == 0


def test_eight_connections_racing_on_one_key_leave_one_job(db_url):
    barrier = threading.Barrier(8)

    def enqueue(value: int) -> tuple[int, bool]:
        try:
            barrier.wait(timeout=10)
            with transaction.atomic():
                outcome = Job.objects.store().enqueue(_spec(value, debounce=1))
            return outcome.id, outcome.created
        finally:
            connections.close_all()

    for _ in range(5):  # several rounds, to give the race several chances
        LiveJob.objects.all().delete()
        HistoryJob.objects.all().delete()
        with ThreadPoolExecutor(max_workers=8) as pool:
            results = list(pool.map(enqueue, range(8)))
        assert len({job_id for job_id, _ in results}) == 1
        assert sum(created for _, created in results) == 1
        assert Job.objects.filter(coalesce_key="reindex:42").count() == 1


def test_an_enqueue_racing_a_claim_waits_then_makes_a_new_job(make_store, observer):
    # While a claim holds the pending job's row, ON CONFLICT waits for it; once the claim
    # commits the job is processing, the key is free, and the enqueue inserts a new job.
    claimer, producer = make_store(), make_store()
    first = producer.enqueue(_spec(1))
    producer_pid = producer.runner.connection.info.backend_pid
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        with claimer.runner.connection.transaction():
            (claimed,) = claimer.claim("w1", ["default"], per_queue=1, lease_seconds=30)
            waiting = pool.submit(producer.enqueue, _spec(2))
            wait_for(
                lambda: observer.execute(
                    "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s",
                    [producer_pid],
                ).fetchone()[0],
                timeout=10,
                message="the enqueue to wait on the claimed row",
            )
        second = waiting.result(timeout=10)
    finally:
        pool.shutdown()
    assert claimed.id == first.id
    assert second.created
    assert second.id != first.id
    assert second.snapshot.args == [2]


def test_a_coalesced_enqueue_reads_its_holder_by_primary_key_under_a_held_snapshot(
    make_store, open_connection
):
    """Every earlier holder a claim took leaves an entry in pgq_job_coalesce_key that a
    held snapshot keeps; the enqueue finds the holder through the key's row instead
    (migration 0026), so it reads none of them (the old statement's ON CONFLICT walked
    every one: 51). The key's row has a version per holder too, but each new one stays
    on its page (HOT): the row's primary key gives one entry per lookup."""
    holder = open_connection()
    holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    holder.execute("SELECT count(*) FROM django_pgqueue_queue_pause").fetchone()
    worker, producer = make_store(), make_store()
    for round_ in range(50):
        producer.enqueue(_spec(round_))
        assert len(worker.claim("w", ["default"], per_queue=1, lease_seconds=30)) == 1
    pending = producer.enqueue(_spec("pending"))
    conn = producer.runner.connection
    with conn.transaction(force_rollback=True):
        before = _coalesce_index_entries(conn)
        key_before = _coalesce_index_entries(conn, "django_pgqueue_coalesce_key_pkey")
        again = producer.enqueue(_spec("again"))
        read = _coalesce_index_entries(conn) - before
        key_read = _coalesce_index_entries(conn, "django_pgqueue_coalesce_key_pkey") - key_before
    assert (again.id, again.created) == (pending.id, False)
    assert read == 0
    assert key_read <= 2  # the lock's uniqueness check, and the lookup
    # The control: a lookup by the key walks the kept entries.
    with conn.transaction(force_rollback=True):
        before = _coalesce_index_entries(conn)
        conn.execute(
            "SELECT id FROM django_pgqueue_job WHERE coalesce_key = 'reindex:42' "
            "AND status = 'pending'"
        ).fetchall()
        assert _coalesce_index_entries(conn) - before > 50
    holder.execute("ROLLBACK")


def _coalesce_index_entries(conn, index: str = "pgq_job_coalesce_key") -> int:
    (count,) = conn.execute(
        "SELECT pg_stat_get_xact_tuples_returned(%s::regclass)", [index]
    ).fetchone()
    return int(count)
