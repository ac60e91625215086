"""Idempotency keys: one job per key, even under concurrent enqueues."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connections, transaction

from django_pgqueue.models import HistoryJob, Job, LiveJob
from django_pgqueue.store.values import JobSpec

pytestmark = pytest.mark.timeout(60)


def test_same_key_returns_the_existing_job_without_error(db):
    first = Job.objects.store().enqueue(JobSpec("tests.tasks.noop", idempotency_key="k"))
    second = Job.objects.store().enqueue(
        JobSpec("tests.tasks.add", args=[1, 2], idempotency_key="k")
    )
    assert first.created
    assert not second.created
    assert second.job.pk == first.job.pk
    assert second.job.task_path == "tests.tasks.noop"
    assert Job.objects.count() == 1


def test_duplicate_inside_the_callers_transaction_keeps_it_usable(db):
    with transaction.atomic():
        Job.objects.enqueue("tests.tasks.noop", idempotency_key="k")
        again = Job.objects.enqueue("tests.tasks.noop", idempotency_key="k")
        # The transaction is not aborted: further statements work.
        assert Job.objects.filter(pk=again.pk).exists()
    assert Job.objects.count() == 1


def test_eight_threads_racing_on_one_key_create_one_job(db_url):
    barrier = threading.Barrier(8)

    def enqueue(_: int) -> tuple[int, bool]:
        try:
            barrier.wait(timeout=10)
            with transaction.atomic():
                outcome = Job.objects.store().enqueue(
                    JobSpec("tests.tasks.noop", idempotency_key="race")
                )
            return outcome.job.pk, outcome.created
        finally:
            connections.close_all()

    for _ in range(5):  # several rounds, to give the race several chances
        LiveJob.objects.all().delete()
        HistoryJob.objects.all().delete()
        with ThreadPoolExecutor(max_workers=8) as pool:
            results = list(pool.map(enqueue, range(8)))
        assert len({job_id for job_id, _ in results}) == 1
        assert sum(created for _, created in results) == 1
        assert Job.objects.filter(idempotency_key="race").count() == 1


def test_when_the_first_inserter_rolls_back_the_second_wins(db_url, make_store):
    first_store = make_store()
    first_conn = first_store.runner.connection
    second_store = make_store()
    first_conn.execute("BEGIN")
    first_store.enqueue(JobSpec("tests.tasks.noop", idempotency_key="contested"))

    outcome = {}

    def second() -> None:
        # Blocks on the unique index until the first transaction ends.
        outcome["value"] = second_store.enqueue(
            JobSpec("tests.tasks.add", args=[1, 1], idempotency_key="contested")
        )

    thread = threading.Thread(target=second)
    thread.start()
    thread.join(timeout=0.5)
    assert thread.is_alive(), "the second enqueue should wait for the first transaction"
    first_conn.execute("ROLLBACK")
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert outcome["value"].created
    assert outcome["value"].job.task_path == "tests.tasks.add"
    assert Job.objects.filter(idempotency_key="contested").count() == 1


def test_when_the_first_inserter_commits_the_second_gets_its_job(db_url, make_store):
    first_store = make_store()
    first_conn = first_store.runner.connection
    second_store = make_store()
    first_conn.execute("BEGIN")
    first = first_store.enqueue(JobSpec("tests.tasks.noop", idempotency_key="contested"))

    outcome = {}
    thread = threading.Thread(
        target=lambda: outcome.setdefault(
            "value",
            second_store.enqueue(JobSpec("tests.tasks.noop", idempotency_key="contested")),
        )
    )
    thread.start()
    thread.join(timeout=0.5)
    assert thread.is_alive()
    first_conn.execute("COMMIT")
    thread.join(timeout=10)
    assert not outcome["value"].created
    assert outcome["value"].job.pk == first.job.pk
