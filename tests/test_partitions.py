"""Per-partition ordering: one job of a partition at a time, in enqueue order."""

from __future__ import annotations

import random
import threading
import time

import pytest

from django_pgqueue.models import Job
from django_pgqueue.states import JobStatus
from django_pgqueue.store.partition import BUCKET_COUNT, bucket_for
from django_pgqueue.store.values import Failure, JobSpec

pytestmark = pytest.mark.timeout(120)


def test_only_the_oldest_pending_job_of_a_partition_is_claimable(store):
    jobs = [
        store.enqueue(JobSpec("tests.tasks.noop", args=[index], partition_key="p")).job
        for index in range(3)
    ]
    free = store.enqueue(JobSpec("tests.tasks.noop")).job
    claimed = store.claim("w", ["default"], per_queue=10, lease_seconds=30)
    assert {job.id for job in claimed} == {jobs[0].pk, free.pk}
    # While the head is processing, nothing else of the partition is claimable.
    assert store.claim("w", ["default"], per_queue=10, lease_seconds=30) == []
    head = next(job for job in claimed if job.id == jobs[0].pk)
    store.complete_many_if_leased("w", [(head.lease, "null")])
    (second,) = store.claim("w", ["default"], per_queue=10, lease_seconds=30)
    assert second.id == jobs[1].pk


def test_a_retrying_head_keeps_blocking_its_partition(store):
    first = store.enqueue(JobSpec("tests.tasks.noop", partition_key="p")).job
    store.enqueue(JobSpec("tests.tasks.noop", partition_key="p"))
    (head,) = store.claim("w", ["default"], per_queue=10, lease_seconds=30)
    outcome = store.fail_if_leased(head.lease, Failure("ValueError", "boom"))
    assert outcome.status == JobStatus.PENDING
    store.runner.connection.execute(
        "UPDATE django_pgqueue_job SET available_at = now() WHERE id = %s", [first.pk]
    )
    (again,) = store.claim("w", ["default"], per_queue=10, lease_seconds=30)
    assert again.id == first.pk


def test_a_dead_lettered_head_unblocks_its_partition(store):
    first = store.enqueue(JobSpec("tests.tasks.noop", partition_key="p", max_attempts=1)).job
    second = store.enqueue(JobSpec("tests.tasks.noop", partition_key="p")).job
    (head,) = store.claim("w", ["default"], per_queue=10, lease_seconds=30)
    assert head.id == first.pk
    outcome = store.fail_if_leased(head.lease, Failure("ValueError", "boom"))
    assert outcome.status == JobStatus.DEAD_LETTER
    (next_job,) = store.claim("w", ["default"], per_queue=10, lease_seconds=30)
    assert next_job.id == second.pk


def test_partitions_span_queues(store):
    store.enqueue(JobSpec("tests.tasks.noop", partition_key="p", queue="emails"))
    store.enqueue(JobSpec("tests.tasks.noop", partition_key="p", queue="default"))
    assert store.claim("w", ["default"], per_queue=10, lease_seconds=30) == []
    assert len(store.claim("w", ["emails"], per_queue=10, lease_seconds=30)) == 1


def test_bucket_masks_limit_partitioned_jobs_to_owned_buckets(store):
    key_a, key_b = "customer:1", "customer:2"
    assert bucket_for(key_a) != bucket_for(key_b)
    store.enqueue(JobSpec("tests.tasks.noop", partition_key=key_a))
    store.enqueue(JobSpec("tests.tasks.noop", partition_key=key_b))
    unpartitioned = store.enqueue(JobSpec("tests.tasks.noop")).job
    mask = ["0"] * BUCKET_COUNT
    mask[bucket_for(key_a)] = "1"
    claimed = store.claim(
        "w", ["default"], per_queue=10, lease_seconds=30, bucket_masks=["".join(mask)]
    )
    assert {job.partition_key for job in claimed} == {key_a, None}
    assert unpartitioned.pk in {job.id for job in claimed}


def test_order_holds_with_eight_concurrent_claimers(store, make_store):
    keys = [f"key-{index}" for index in range(10)]
    per_key = 40
    specs = [
        JobSpec("tests.tasks.noop", args=[key, sequence], partition_key=key)
        for sequence in range(per_key)
        for key in keys
    ]
    store.enqueue_many(specs)
    stores = [make_store() for _ in range(8)]
    lock = threading.Lock()
    running: dict[str, int] = {}
    executed: dict[str, list[int]] = {key: [] for key in keys}
    violations: list[str] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def worker(index: int) -> None:
        rng = random.Random(index)
        my_store = stores[index]
        try:
            barrier.wait(timeout=10)
            idle_rounds = 0
            while idle_rounds < 20:
                batch = my_store.claim(f"w{index}", ["default"], per_queue=3, lease_seconds=60)
                if not batch:
                    idle_rounds += 1
                    time.sleep(0.005)
                    continue
                idle_rounds = 0
                for job in batch:
                    key, sequence = job.args
                    with lock:
                        if key in running:
                            violations.append(f"{key}: {sequence} overlapped {running[key]}")
                        running[key] = sequence
                        executed[key].append(sequence)
                    time.sleep(rng.random() * 0.002)
                    with lock:
                        del running[key]
                    my_store.complete_many_if_leased(f"w{index}", [(job.lease, "null")])
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(index,)) for index in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=100)
    assert not errors
    assert not violations
    for key in keys:
        assert executed[key] == list(range(per_key)), key
    assert Job.objects.filter(status=JobStatus.SUCCEEDED).count() == len(specs)
