"""The partition claim state: kept by the queue's statements, repaired when someone else
wrote the job table, and never a lock a worker's bookkeeping could wait on."""

from __future__ import annotations

import psycopg
import pytest

from django_pgqueue.models import Job, Partition
from django_pgqueue.states import JobStatus
from django_pgqueue.store.queue import QueueStore
from django_pgqueue.store.runners import DjangoRunner
from django_pgqueue.store.sql import QUERIES
from django_pgqueue.store.values import Failure, JobSpec
from django_pgqueue.worker.housekeeping import PartitionRepair
from tests.claim_params import claim_params
from tests.test_migrations import _manage, scratch_database  # noqa: F401 - fixture

pytestmark = pytest.mark.timeout(120)

# What a producer of the previous release wrote: a job row, no partition signal.
OLD_PRODUCER_INSERT = """
INSERT INTO django_pgqueue_job (
    queue, task_path, args, kwargs, priority, status, attempts, max_attempts,
    lease_generation, available_at, created_at, errors, partition_key, partition_bucket
)
VALUES ('default', 'tests.tasks.noop', '[]', '{}', 0, 'pending', 0, 5, 0, now(), now(),
    '[]', %s, 0)
RETURNING id
"""


def _claim_ids(store: QueueStore) -> list[int]:
    return [job.id for job in store.claim("w", ["default"], per_queue=10, lease_seconds=30)]


def test_the_partition_row_follows_claim_and_completion(store):
    first = store.enqueue(JobSpec("tests.tasks.noop", partition_key="p")).job
    second = store.enqueue(JobSpec("tests.tasks.noop", partition_key="p")).job
    (head,) = store.claim("w", ["default"], per_queue=10, lease_seconds=30)
    assert head.id == first.pk
    row = Partition.objects.get(pk="p")
    assert row.running_id == first.pk
    store.complete_many_if_leased("w", [(head.lease, "null")])
    row = Partition.objects.get(pk="p")
    assert (row.running_id, row.head_id) == (None, second.pk)
    (nxt,) = store.claim("w", ["default"], per_queue=10, lease_seconds=30)
    store.fail_if_leased(nxt.lease, Failure("E", "permanent", permanent=True))
    # Nothing left in the partition: its row is gone.
    assert not Partition.objects.filter(pk="p").exists()


def test_jobs_of_a_previous_release_producer_are_repaired_into_claims(store):
    (job_id,) = store.runner.connection.execute(OLD_PRODUCER_INSERT, ["legacy"]).fetchone()
    assert _claim_ids(store) == []  # no partition row, no signal: invisible to claims
    repair = PartitionRepair()
    assert repair.run(store) == 1
    assert _claim_ids(store) == [job_id]


def test_a_running_mark_left_by_a_previous_release_worker_is_repaired(store):
    first = store.enqueue(JobSpec("tests.tasks.noop", partition_key="p")).job
    second = store.enqueue(JobSpec("tests.tasks.noop", partition_key="p")).job
    assert _claim_ids(store) == [first.pk]
    # A worker of the previous release completes it: the job row only.
    store.runner.connection.execute(
        "UPDATE django_pgqueue_job SET status = 'succeeded', finished_at = now(), "
        "lease_expires_at = NULL WHERE id = %s",
        [first.pk],
    )
    assert _claim_ids(store) == []  # the partition still looks busy
    assert PartitionRepair().run(store) == 1
    assert _claim_ids(store) == [second.pk]


def test_the_repair_sweep_walks_partitions_a_slice_at_a_time(store):
    conn = store.runner.connection
    for index in range(25):
        conn.execute(OLD_PRODUCER_INSERT, [f"k{index:02d}"])
    repair = PartitionRepair()
    repair.SCAN_LIMIT = 10
    assert [repair.run(store) for _ in range(4)] == [10, 10, 5, 0]
    assert len(_claim_ids(store)) == 10  # per_queue=10; all 25 are claimable now


def test_an_open_producer_transaction_never_blocks_the_partition_bookkeeping(
    store, open_connection
):
    first = store.enqueue(JobSpec("tests.tasks.noop", partition_key="p")).job
    (head,) = store.claim("w", ["default"], per_queue=10, lease_seconds=30)
    assert head.id == first.pk
    producer = open_connection(prepare=False)
    producer_store = QueueStore(_PsycopgRunner(producer))
    with producer.transaction():
        # A producer enqueues into the busy partition and keeps its transaction open.
        later = producer_store.enqueue(JobSpec("tests.tasks.noop", partition_key="p"))
        # The worker's bookkeeping on that partition goes through at once.
        store.runner.connection.execute("SET lock_timeout = '2s'")
        store.complete_many_if_leased("w", [(head.lease, "null")])
        assert _claim_ids(store) == []  # the new job is not committed yet
    # Committed: the producer's signal brings it into the next claim.
    assert _claim_ids(store) == [later.id]


def test_an_open_operator_transaction_never_blocks_the_partition_bookkeeping(
    store, open_connection
):
    first = store.enqueue(JobSpec("tests.tasks.noop", partition_key="p")).job
    second = store.enqueue(JobSpec("tests.tasks.noop", partition_key="p")).job
    third = store.enqueue(JobSpec("tests.tasks.noop", partition_key="p")).job
    (head,) = store.claim("w", ["default"], per_queue=10, lease_seconds=30)
    operator = open_connection(prepare=False)
    with operator.transaction():
        assert QueueStore(_PsycopgRunner(operator)).cancel([second.pk]).done == (second.pk,)
        store.runner.connection.execute("SET lock_timeout = '2s'")
        store.complete_many_if_leased("w", [(head.lease, "null")])
    assert head.id == first.pk
    assert _claim_ids(store) == [third.pk]


def test_enqueue_in_a_rolled_back_transaction_leaves_no_partition_state(db):
    from django.db import transaction

    with pytest.raises(RuntimeError), transaction.atomic():
        Job.objects.enqueue("tests.tasks.noop", partition_key="gone")
        raise RuntimeError
    store = QueueStore(DjangoRunner("default"))
    assert store.fold_partition_signals() == 0
    assert not Partition.objects.filter(pk="gone").exists()


def test_migration_0004_makes_existing_partitioned_jobs_claimable(scratch_database):  # noqa: F811
    _manage(scratch_database, "migrate", "django_pgqueue", "0003")
    with psycopg.connect(scratch_database, autocommit=True) as conn:
        ids = [conn.execute(OLD_PRODUCER_INSERT, [key]).fetchone()[0] for key in "abc"]
        conn.execute(OLD_PRODUCER_INSERT, ["a"])  # queued behind a's head
    _manage(scratch_database, "migrate", "django_pgqueue")
    with psycopg.connect(scratch_database, autocommit=True) as conn:
        # The migration left one signal per partition with work; a claim folds them in.
        assert conn.execute(QUERIES["fold_signals"].text, {"batch_size": 100}).fetchone()[0] == 3
        rows = conn.execute(
            QUERIES["claim_batch"].text,
            claim_params(10, worker_id="w"),
        ).fetchall()
        assert sorted(row[0] for row in rows if row[0] is not None) == ids
    _manage(scratch_database, "migrate", "django_pgqueue", "0003")  # and it reverses


def _PsycopgRunner(conn):
    from django_pgqueue.store.runners import PsycopgRunner

    return PsycopgRunner(conn, "default")


def test_a_cancelled_running_job_keeps_its_partition_until_its_handler_returns(store, make_store):
    first = store.enqueue(JobSpec("tests.tasks.noop", partition_key="p")).job
    second = store.enqueue(JobSpec("tests.tasks.noop", partition_key="p")).job
    (head,) = store.claim("w", ["default"], per_queue=10, lease_seconds=30)
    assert head.id == first.pk
    assert _claim_ids(store) == []  # the partition is busy
    assert make_store().cancel([first.pk]).running == (first.pk,)
    # The cancelled handler may still run: the partition waits for it.
    assert _claim_ids(store) == []
    assert Partition.objects.get(pk="p").running_id == first.pk
    assert store.complete_many_outcomes("w", [(head.lease, "null")]) == {
        first.pk: JobStatus.CANCELLED
    }
    assert _claim_ids(store) == [second.pk]
    assert Partition.objects.get(pk="p").running_id == second.pk
