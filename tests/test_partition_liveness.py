"""Partition liveness: a ready head is claimable in the next claim, whatever is behind it.

Whatever is queued behind a head (a deep backlog, rows of higher priority, the head's own
retry backoff) and whatever other partitions hold, the oldest pending job of a partition
with nothing processing is claimed by the next claim that has room for it. The depths
here (1,500 and 2,000 rows) are past the default PARTITION_SCAN_LIMIT of 1,000.
"""

from __future__ import annotations

import datetime as dt
import random

import pytest
from django.utils import timezone

from django_pgqueue.states import JobStatus
from django_pgqueue.store.retry import RetryPolicy
from django_pgqueue.store.values import Failure, JobSpec
from tests.workers import wait_for

pytestmark = pytest.mark.timeout(120)

DEPTH = 1500


def _claim(store, limit=10):
    return store.claim("w", ["default"], per_queue=[limit], lease_seconds=60, bucket_masks=None)


def _backlog(store, key, count, **options):
    """Enqueue ``count`` jobs of partition ``key``; return their ids in enqueue order."""
    outcomes = store.enqueue_many(
        [
            JobSpec("tests.tasks.noop", args=[key, index], partition_key=key, **options)
            for index in range(count)
        ]
    )
    return [outcome.job.pk for outcome in outcomes]


def _db_now(store):
    return store.runner.connection.execute("SELECT now()").fetchone()[0]


@pytest.mark.parametrize("made_ready_by", ["run_now", "short_backoff"])
def test_a_head_that_failed_once_is_claimable_again_over_a_deep_backlog(store, made_ready_by):
    head_id = store.enqueue(JobSpec("tests.tasks.noop", partition_key="p")).job.pk
    (head,) = _claim(store)
    assert head.id == head_id
    behind = _backlog(store, "p", DEPTH)
    # The retry's available_at now sorts after every row queued behind the head.
    outcome = store.fail_if_leased(
        head.lease, Failure("ValueError", "boom"), RetryPolicy(0.3, 0.3, 0.0)
    )
    assert outcome.status == JobStatus.PENDING
    if made_ready_by == "run_now":
        assert store.run_now([head_id]).done == (head_id,)
    else:
        wait_for(lambda: _db_now(store) >= outcome.available_at, timeout=10)
    claimed = _claim(store)
    assert [job.id for job in claimed] == [head_id], (
        f"the retried head of a partition with {len(behind)} rows behind it was not claimed"
    )
    assert claimed[0].attempts == 2


def test_a_head_below_the_priority_of_another_partitions_backlog_is_claimable(store):
    busy = _backlog(store, "busy", DEPTH + 1, priority=10)
    low_head = store.enqueue(JobSpec("tests.tasks.noop", partition_key="low", priority=0)).job.pk
    (first,) = _claim(store, limit=1)
    assert first.id == busy[0]  # the busy partition's head is processing now
    claimed = _claim(store)
    assert [job.id for job in claimed] == [low_head], (
        "a low-priority head was hidden by another partition's high-priority backlog"
    )


def test_a_head_below_the_priority_of_its_own_backlog_is_claimable(store):
    head = store.enqueue(JobSpec("tests.tasks.noop", partition_key="p", priority=0)).job.pk
    _backlog(store, "p", DEPTH, priority=10)
    claimed = _claim(store)
    assert [job.id for job in claimed] == [head], (
        "a head with lower priority than the rows behind it in its own partition was not claimed"
    )


def test_a_busy_partition_with_a_deep_backlog_hides_no_other_head(store):
    busy = _backlog(store, "busy", 2000)
    (first,) = _claim(store, limit=1)
    assert first.id == busy[0]
    others = [
        store.enqueue(JobSpec("tests.tasks.noop", partition_key=f"other-{index}")).job.pk
        for index in range(5)
    ]
    claimed = _claim(store)
    assert sorted(job.id for job in claimed) == others, (
        "a busy partition's 2,000-row backlog hid the ready heads of other partitions"
    )


@pytest.mark.parametrize("depth", [5, 1200])
def test_order_within_a_partition_is_enqueue_order(store, depth):
    rng = random.Random(depth)
    now = timezone.now()
    # Priorities and ready times that disagree with enqueue order: the head has the
    # lowest priority and the latest ready time of all, the others are shuffled.
    specs = [
        JobSpec(
            "tests.tasks.noop",
            args=[index],
            partition_key="ordered",
            priority=-100 if index == 0 else rng.randint(0, 100),
            available_at=now - dt.timedelta(seconds=1 if index == 0 else rng.randint(2, 3600)),
        )
        for index in range(depth)
    ]
    ids = [outcome.job.pk for outcome in store.enqueue_many(specs)]
    assert ids == sorted(ids)
    order = []
    for _ in range(min(depth, 30)):
        claimed = _claim(store)
        assert len(claimed) == 1, f"after {order}: claimed {[job.id for job in claimed]}"
        order.append(claimed[0].id)
        store.complete_many_if_leased("w", [(claimed[0].lease, "null")])
    assert order == ids[: len(order)]
