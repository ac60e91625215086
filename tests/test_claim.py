"""Claiming: order, batch size, queues, schedules and exclusivity under concurrency."""

from __future__ import annotations

import datetime as dt
import threading
from collections import Counter

import pytest
from django.utils import timezone

from django_pgqueue.models import Job
from django_pgqueue.states import JobStatus
from django_pgqueue.store.values import JobSpec

pytestmark = pytest.mark.timeout(120)


def _enqueue(store, count, **options):
    return [
        outcome.job
        for outcome in store.enqueue_many(
            [JobSpec("tests.tasks.noop", **options) for _ in range(count)]
        )
    ]


def test_claim_leases_the_job_on_the_database_clock(store):
    (job,) = _enqueue(store, 1)
    (claimed,) = store.claim("w1", ["default"], per_queue=10, lease_seconds=30)
    assert claimed.id == job.pk
    assert claimed.attempts == 1
    assert claimed.lease_generation == 1
    assert claimed.worker_id == "w1"
    assert claimed.lease_expires_at - claimed.claimed_at == dt.timedelta(seconds=30)
    row = Job.objects.get(pk=job.pk)
    assert row.status == JobStatus.PROCESSING
    assert row.claimed_by == "w1"
    assert row.started_at == row.claimed_at == claimed.claimed_at
    db_now = store.runner.connection.execute("SELECT now()").fetchone()[0]
    assert abs((claimed.claimed_at - db_now).total_seconds()) < 5


def test_claim_order_is_priority_then_available_at_then_id(store):
    now = timezone.now()
    low_old = store.enqueue(
        JobSpec("tests.tasks.noop", priority=0, available_at=now - dt.timedelta(minutes=5))
    ).job
    high_new = store.enqueue(
        JobSpec("tests.tasks.noop", priority=50, available_at=now - dt.timedelta(minutes=1))
    ).job
    high_old = store.enqueue(
        JobSpec("tests.tasks.noop", priority=50, available_at=now - dt.timedelta(minutes=2))
    ).job
    low_tie_a = store.enqueue(
        JobSpec("tests.tasks.noop", priority=0, available_at=now - dt.timedelta(minutes=1))
    ).job
    low_tie_b = store.enqueue(
        JobSpec("tests.tasks.noop", priority=0, available_at=now - dt.timedelta(minutes=1))
    ).job
    negative = store.enqueue(
        JobSpec("tests.tasks.noop", priority=-10, available_at=now - dt.timedelta(hours=1))
    ).job
    order = []
    while claimed := store.claim("w", ["default"], per_queue=1, lease_seconds=30):
        order.extend(job.id for job in claimed)
    assert order == [high_old.pk, high_new.pk, low_old.pk, low_tie_a.pk, low_tie_b.pk, negative.pk]


def test_claim_respects_batch_size_and_queues(store):
    _enqueue(store, 30)
    _enqueue(store, 5, queue="emails")
    claimed = store.claim("w", ["default"], per_queue=10, lease_seconds=30)
    assert len(claimed) == 10
    assert {job.queue for job in claimed} == {"default"}
    claimed = store.claim("w", ["default", "emails"], per_queue=10, lease_seconds=30)
    assert Counter(job.queue for job in claimed) == {"default": 10, "emails": 5}


def test_each_queue_gets_its_own_share_so_a_flood_cannot_starve_another(store):
    _enqueue(store, 1000, queue="default")
    (late,) = _enqueue(store, 1, queue="emails")
    claimed = store.claim("w", ["default", "emails"], per_queue=5, lease_seconds=30)
    assert late.pk in {job.id for job in claimed}


def test_future_jobs_are_not_claimed_until_due(store):
    store.enqueue(JobSpec("tests.tasks.noop", available_at=timezone.now() + dt.timedelta(hours=1)))
    assert store.claim("w", ["default"], per_queue=10, lease_seconds=30) == []


def test_claim_returns_arguments_and_options(store):
    store.enqueue(
        JobSpec(
            "tests.tasks.add",
            args=[1, 2],
            kwargs={"x": [1, {"y": None}]},
            max_attempts=7,
            idempotency_key="key",
        )
    )
    (claimed,) = store.claim("w", ["default"], per_queue=10, lease_seconds=30)
    assert (claimed.task_path, claimed.args, claimed.kwargs) == (
        "tests.tasks.add",
        [1, 2],
        {"x": [1, {"y": None}]},
    )
    assert (claimed.max_attempts, claimed.idempotency_key, claimed.prior_workers) == (7, "key", [])


def test_eight_concurrent_claimers_never_get_the_same_job(store, make_store):
    total = 4000
    _enqueue(store, total)
    stores = [make_store() for _ in range(8)]
    barrier = threading.Barrier(8)
    claimed_by: dict[int, list[int]] = {index: [] for index in range(8)}
    errors: list[BaseException] = []

    def claimer(index: int) -> None:
        try:
            barrier.wait(timeout=10)
            while batch := stores[index].claim(
                f"w{index}", ["default"], per_queue=25, lease_seconds=60
            ):
                claimed_by[index].extend(job.id for job in batch)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=claimer, args=(index,)) for index in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=90)
    assert not errors
    all_ids = [job_id for ids in claimed_by.values() for job_id in ids]
    assert len(all_ids) == total
    assert len(set(all_ids)) == total
    assert sum(1 for ids in claimed_by.values() if ids) > 1, "claims should interleave"
    # Every row is leased to exactly the worker that got it, at generation 1.
    owners = dict(Job.objects.filter(status=JobStatus.PROCESSING).values_list("id", "claimed_by"))
    for index, ids in claimed_by.items():
        assert all(owners[job_id] == f"w{index}" for job_id in ids)
    assert set(Job.objects.values_list("lease_generation", flat=True)) == {1}
