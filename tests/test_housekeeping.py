"""Housekeeping passes: one worker at a time, recovery, pruning in batches."""

from __future__ import annotations

import pytest
from django.test import override_settings

from django_pgqueue.models import Job, QueueStat, Worker
from django_pgqueue.states import JobStatus, WorkerStatus
from django_pgqueue.store.values import Failure, JobSpec
from django_pgqueue.worker.connection import ConnectionSlot
from django_pgqueue.worker.housekeeping import run_pass

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def slots(db_url):
    opened = []

    def make():
        slot = ConnectionSlot("default", "test housekeeping")
        opened.append(slot)
        return slot

    yield make
    for slot in opened:
        slot.close()


def test_only_one_worker_at_a_time_runs_a_pass(slots):
    holder, other = slots(), slots()
    with holder.connection.transaction():
        assert holder.store.try_housekeeping_lock()
        assert run_pass(other, worker_timeout=30) == run_pass(other, worker_timeout=30)
        assert not run_pass(other, worker_timeout=30).ran
    # The lock went with the transaction: the next pass runs.
    assert run_pass(other, worker_timeout=30).ran


def test_a_pass_reaps_marks_dead_and_prunes(slots, store):
    store.enqueue(JobSpec("tests.tasks.noop"))
    (claimed,) = store.claim("gone", ["default"], per_queue=1, lease_seconds=30)
    store.register_worker(
        "gone",
        hostname="h",
        pid=1,
        queues=["default"],
        concurrency=1,
        metadata={},
        timeout_seconds=1,
    )
    conn = store.runner.connection
    conn.execute("UPDATE django_pgqueue_job SET lease_expires_at = now() - interval '1 minute'")
    conn.execute("UPDATE django_pgqueue_worker SET last_seen_at = now() - interval '1 minute'")
    report = run_pass(slots(), worker_timeout=30)
    assert (report.ran, report.reaped, report.workers_marked_dead) == (True, 1, 1)
    assert Job.objects.get(pk=claimed.id).status == JobStatus.PENDING
    assert Worker.objects.get(pk="gone").status == WorkerStatus.DEAD


def _finish_jobs(store, count, *, status="succeeded", age="8 days"):
    jobs = store.enqueue_many([JobSpec("tests.tasks.noop") for _ in range(count)])
    store.runner.connection.execute(
        "UPDATE django_pgqueue_job SET status = %s, finished_at = now() - %s::interval "
        "WHERE id = ANY(%s)",
        [status, age, [outcome.job.pk for outcome in jobs]],
    )


def test_finished_jobs_are_pruned_in_batches_after_the_retention(slots, store):
    _finish_jobs(store, 25)
    _finish_jobs(store, 5, age="1 day")  # younger than the 7 day default retention
    _finish_jobs(store, 3, status="dead_letter")  # dead letters are kept by default
    slot = slots()
    with override_settings(PGQUEUE_PRUNE_BATCH_SIZE=10):
        assert [run_pass(slot, worker_timeout=30).pruned for _ in range(4)] == [10, 10, 5, 0]
    assert Job.objects.filter(status=JobStatus.SUCCEEDED).count() == 5
    assert Job.objects.filter(status=JobStatus.DEAD_LETTER).count() == 3
    with override_settings(PGQUEUE_DEAD_LETTER_RETENTION_SECONDS=3600):
        assert run_pass(slot, worker_timeout=30).pruned == 3


def test_retention_none_keeps_everything(slots, store):
    _finish_jobs(store, 5, age="100 days")
    with override_settings(PGQUEUE_RETENTION_SECONDS=None):
        assert run_pass(slots(), worker_timeout=30).pruned == 0
    assert Job.objects.count() == 5


def test_statistics_accumulate_per_queue_and_minute(store):
    from django_pgqueue.store.reports import QueueCounts

    store.record_queue_stats([QueueCounts("default", 3, 1, 0, 40), QueueCounts("emails", 1)])
    store.record_queue_stats([QueueCounts("default", 2, 0, 1, 90)])
    default = QueueStat.objects.get(queue="default")
    assert (default.succeeded, default.failed, default.dead_lettered, default.wait_ms_max) == (
        5,
        1,
        1,
        90,
    )
    assert QueueStat.objects.get(queue="emails").succeeded == 1


def test_a_failed_then_reaped_history_reads_in_order(store, slots):
    store.enqueue(JobSpec("tests.tasks.noop", max_attempts=3))
    (first,) = store.claim("w1", ["default"], per_queue=1, lease_seconds=30)
    store.fail_if_leased(first.lease, Failure("E", "first"))
    store.runner.connection.execute("UPDATE django_pgqueue_job SET available_at = now()")
    store.claim("w2", ["default"], per_queue=1, lease_seconds=30)
    store.runner.connection.execute(
        "UPDATE django_pgqueue_job SET lease_expires_at = now() - interval '1 second'"
    )
    run_pass(slots(), worker_timeout=30)
    job = Job.objects.get(pk=first.id)
    assert [(e["attempt"], e["worker"]) for e in job.errors] == [(1, "w1"), (2, "w2")]
