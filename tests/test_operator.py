"""Operator actions: retry, run now, cancel, discard, requeue expired."""

from __future__ import annotations

import datetime as dt
import threading
import time

import pytest
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from django_pgqueue.exceptions import InvalidOption, LeaseLost
from django_pgqueue.models import Job, LiveJob
from django_pgqueue.states import JobStatus
from django_pgqueue.store.values import Failure, JobSpec

pytestmark = pytest.mark.timeout(60)


def _dead_letter(store, **options):
    job = store.enqueue(JobSpec("tests.tasks.noop", max_attempts=1, **options)).job
    (claimed,) = store.claim("w", [job.queue], per_queue=1, lease_seconds=30)
    store.fail_if_leased(claimed.lease, Failure("E", "boom"))
    return claimed


def test_retry_revives_dead_letters_and_cancelled_jobs(store):
    dead = _dead_letter(store)
    cancelled = store.enqueue(JobSpec("tests.tasks.noop")).job
    store.cancel([cancelled.pk])
    pending = store.enqueue(
        JobSpec("tests.tasks.noop", available_at=timezone.now() + dt.timedelta(days=1))
    ).job
    result = store.retry([dead.id, cancelled.pk, pending.pk])
    assert result.done == tuple(sorted([dead.id, cancelled.pk]))
    assert result.skipped == (pending.pk,)
    revived = Job.objects.get(pk=dead.id)
    assert (revived.status, revived.attempts, revived.finished_at) == (JobStatus.PENDING, 0, None)
    assert revived.lease_generation == dead.lease_generation  # never reset
    assert len(revived.errors) == 1  # history is kept
    claimed = store.claim("w", ["default"], per_queue=10, lease_seconds=30)
    assert {job.id for job in claimed} == {dead.id, cancelled.pk}
    assert (
        next(job for job in claimed if job.id == dead.id).lease_generation
        == dead.lease_generation + 1
    )


def test_a_stale_lease_from_before_the_retry_stays_fenced(store):
    dead = _dead_letter(store)
    store.retry([dead.id])
    store.claim("w2", ["default"], per_queue=1, lease_seconds=30)
    with pytest.raises(LeaseLost):
        store.complete_if_leased(dead.lease, "null")


def test_run_now_makes_scheduled_jobs_ready(store):
    later = store.enqueue(
        JobSpec("tests.tasks.noop", available_at=timezone.now() + dt.timedelta(days=1))
    ).job
    ready = store.enqueue(JobSpec("tests.tasks.noop")).job
    result = store.run_now([later.pk, ready.pk])
    assert result.done == (later.pk,)
    assert result.skipped == (ready.pk,)
    assert len(store.claim("w", ["default"], per_queue=10, lease_seconds=30)) == 2


def test_cancel_touches_pending_and_running_jobs_and_skips_finished_ones(store):
    pending = store.enqueue(JobSpec("tests.tasks.noop")).job
    running = store.enqueue(JobSpec("tests.tasks.noop", queue="emails")).job
    (lease,) = [job.lease for job in store.claim("w", ["emails"], per_queue=1, lease_seconds=30)]
    finished = _dead_letter(store, queue="other")
    result = store.cancel([pending.pk, running.pk, finished.id], reason="not needed")
    assert result.done == tuple(sorted([pending.pk, running.pk]))
    assert result.skipped == (finished.id,)
    assert result.busy == ()
    job = Job.objects.get(pk=pending.pk)
    assert (job.status, job.last_error) == (JobStatus.CANCELLED, "not needed")
    assert job.finished_at is not None
    assert result.running == (running.pk,)
    job = Job.objects.get(pk=running.pk)
    # Asked to stop: its handler may still run, so the job keeps its lease until then.
    assert (job.status, job.last_error, job.lease_generation) == (
        JobStatus.PROCESSING,
        "not needed",
        lease.lease_generation,
    )
    assert job.cancel_requested_at is not None
    # A retry cannot revive it while it runs.
    assert store.retry([running.pk]).done == ()
    # The worker can still extend its lease and record steps; what it records as the
    # outcome ends the job cancelled, the result dropped.
    store.extend_lease_if_leased(lease, 30)
    store.set_step_if_leased(lease, "late")
    with pytest.raises(LeaseLost):  # an atomic task's completion is refused: rolled back
        store.complete_if_leased(lease, '"late"')
    assert store.complete_many_outcomes("w", [(lease, '"late"')]) == {
        running.pk: JobStatus.CANCELLED
    }
    job = Job.objects.get(pk=running.pk)
    assert (job.status, job.result, job.lease_expires_at) == (JobStatus.CANCELLED, None, None)
    assert job.finished_at is not None
    # Ended: every later write of that lease is refused.
    for write in (
        lambda: store.fail_if_leased(lease, Failure("E", "late")),
        lambda: store.set_step_if_leased(lease, "later"),
        lambda: store.extend_lease_if_leased(lease, 30),
    ):
        with pytest.raises(LeaseLost):
            write()


@pytest.mark.parametrize("how", ["fail", "release", "reap"])
def test_a_cancelled_running_job_ends_cancelled_however_its_attempt_ends(store, how):
    job = store.enqueue(JobSpec("tests.tasks.noop", max_attempts=5)).job
    (lease,) = [
        claimed.lease for claimed in store.claim("w", ["default"], per_queue=1, lease_seconds=30)
    ]
    store.cancel([job.pk])
    if how == "fail":
        outcome = store.fail_if_leased(lease, Failure("E", "stopped"))
        assert outcome.status == JobStatus.CANCELLED
    elif how == "release":
        store.release_if_leased(lease, reason="handed back")
    else:
        LiveJob.objects.filter(pk=job.pk).update(lease_expires_at=F("claimed_at"))
        (reaped,) = store.reap_expired(job_ids=[job.pk])
        assert reaped.status == JobStatus.CANCELLED
    row = Job.objects.get(pk=job.pk)
    assert row.status == JobStatus.CANCELLED, how
    assert row.finished_at is not None
    # Not retried on its own, not counted as a dead letter.
    assert store.claim("w", ["default"], per_queue=1, lease_seconds=30) == []


def test_cancel_tries_a_locked_row_again_then_reports_it_busy(store, make_store):
    job = store.enqueue(JobSpec("tests.tasks.noop")).job
    holder = make_store()
    conn = holder.runner.connection
    conn.execute("BEGIN")
    conn.execute("SELECT id FROM django_pgqueue_job WHERE id = %s FOR UPDATE", [job.pk])
    started = time.monotonic()
    result = store.cancel([job.pk])  # must not wait for the lock for long
    waited = time.monotonic() - started
    assert result.skipped == (job.pk,)
    assert result.busy == (job.pk,)
    assert waited < 10, waited  # about a second (CANCEL_PATIENCE), never indefinitely
    conn.execute("ROLLBACK")
    assert store.cancel([job.pk]).done == (job.pk,)


def test_cancel_waits_out_a_lock_held_for_an_instant(store, make_store):
    job = store.enqueue(JobSpec("tests.tasks.noop")).job
    holder = make_store()
    conn = holder.runner.connection
    conn.execute("BEGIN")
    conn.execute("SELECT id FROM django_pgqueue_job WHERE id = %s FOR UPDATE", [job.pk])
    release = threading.Timer(0.1, lambda: conn.execute("ROLLBACK"))
    release.start()
    try:
        result = store.cancel([job.pk])
    finally:
        release.join()
    assert (result.done, result.busy) == ((job.pk,), ())


def test_discard_deletes_only_finished_jobs(store):
    dead = _dead_letter(store)
    pending = store.enqueue(JobSpec("tests.tasks.noop")).job
    result = store.discard([dead.id, pending.pk, 10**12])
    assert result.done == (dead.id,)
    assert result.skipped == (pending.pk, 10**12)
    assert not Job.objects.filter(pk=dead.id).exists()


def test_requeue_expired_recovers_only_expired_leases(store):
    store.enqueue_many([JobSpec("tests.tasks.noop") for _ in range(2)])
    first, second = store.claim("w", ["default"], per_queue=2, lease_seconds=30)
    store.runner.connection.execute(
        "UPDATE django_pgqueue_job SET lease_expires_at = now() - interval '1 second' "
        "WHERE id = %s",
        [first.id],
    )
    result = store.requeue_expired([first.id, second.id])
    assert result.done == (first.id,)
    assert result.skipped == (second.id,)
    assert Job.objects.get(pk=first.id).status == JobStatus.PENDING


def test_operator_ids_must_be_integers(store):
    with pytest.raises(InvalidOption):
        store.retry(["1"])


def test_operator_actions_handle_more_ids_than_one_chunk(store):
    jobs = store.enqueue_many([JobSpec("tests.tasks.noop") for _ in range(2500)])
    result = store.cancel([outcome.job.pk for outcome in jobs])
    assert len(result.done) == 2500
    assert Job.objects.filter(status=JobStatus.CANCELLED).count() == 2500


@pytest.mark.django_db
@pytest.mark.parametrize("action", ["retry", "cancel", "run_now", "discard", "requeue_expired"])
@pytest.mark.parametrize("job_id", [2**63, -(2**63) - 1, 10**30])
def test_ids_outside_the_bigint_range_raise_and_leave_the_transaction_usable(action, job_id):
    with transaction.atomic():
        job = Job.objects.enqueue("tests.tasks.noop")
        with pytest.raises(InvalidOption, match="job_ids") as caught:
            getattr(Job.objects, action)([job.pk, job_id])
        assert str(job_id) in str(caught.value)
        # Nothing reached SQL, so the caller's transaction goes on.
        assert Job.objects.get(pk=job.pk).status == JobStatus.PENDING
