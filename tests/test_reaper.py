"""Recovering expired leases, retries with backoff, and dead letters."""

from __future__ import annotations

import threading

import pytest

from django_pgqueue.exceptions import LeaseLost
from django_pgqueue.models import HistoryJob, Job, LiveJob
from django_pgqueue.states import JobStatus
from django_pgqueue.store.retry import RetryPolicy
from django_pgqueue.store.values import Failure, JobSpec

pytestmark = pytest.mark.timeout(60)


def _expire(store, job_id):
    store.runner.connection.execute(
        "UPDATE django_pgqueue_job SET lease_expires_at = now() - interval '1 second' "
        "WHERE id = %s",
        [job_id],
    )


def test_expired_lease_goes_back_to_pending_with_history(store):
    store.enqueue(JobSpec("tests.tasks.noop"))
    (claimed,) = store.claim("crashed", ["default"], per_queue=1, lease_seconds=30)
    _expire(store, claimed.id)
    (reaped,) = store.reap_expired(policy=RetryPolicy(10, 10, 0))
    assert reaped.status == JobStatus.PENDING
    job = Job.objects.get(pk=claimed.id)
    assert job.status == JobStatus.PENDING
    assert job.claimed_by is None
    assert job.last_error_class == "django_pgqueue.exceptions.LeaseExpired"
    assert "crashed" in job.last_error
    (entry,) = job.errors
    assert (entry["worker"], entry["attempt"]) == ("crashed", 1)
    assert 9 < (job.available_at - job.claimed_at).total_seconds() < 12  # backoff applied


def test_live_leases_are_not_reaped(store):
    store.enqueue(JobSpec("tests.tasks.noop"))
    store.claim("w", ["default"], per_queue=1, lease_seconds=30)
    assert store.reap_expired() == []


def test_expired_lease_on_the_last_attempt_is_dead_lettered(store):
    store.enqueue(JobSpec("tests.tasks.noop", max_attempts=2))
    for attempt in (1, 2):
        (claimed,) = store.claim("w", ["default"], per_queue=1, lease_seconds=30)
        assert claimed.attempts == attempt
        _expire(store, claimed.id)
        (reaped,) = store.reap_expired(policy=RetryPolicy(0, 0, 0))
    assert reaped.status == JobStatus.DEAD_LETTER
    job = Job.objects.get(pk=claimed.id)
    assert job.finished_at is not None
    assert len(job.errors) == 2
    assert store.claim("w", ["default"], per_queue=1, lease_seconds=30) == []


def test_reaper_skips_a_row_whose_completion_is_in_flight(store, make_store):
    store.enqueue(JobSpec("tests.tasks.noop"))
    (claimed,) = store.claim("w", ["default"], per_queue=1, lease_seconds=30)
    _expire(store, claimed.id)
    completer = make_store()
    conn = completer.runner.connection
    conn.execute("BEGIN")
    completer.complete_if_leased(claimed.lease, '"late but fine"')
    # The completing transaction holds the row lock: the reaper skips it, never waits.
    assert store.reap_expired() == []
    conn.execute("COMMIT")
    assert store.reap_expired() == []
    job = Job.objects.get(pk=claimed.id)
    assert (job.status, job.result) == (JobStatus.SUCCEEDED, "late but fine")


def test_a_completion_after_reaping_is_refused(store):
    store.enqueue(JobSpec("tests.tasks.noop"))
    (claimed,) = store.claim("w", ["default"], per_queue=1, lease_seconds=30)
    _expire(store, claimed.id)
    store.reap_expired()
    with pytest.raises(LeaseLost):
        store.complete_if_leased(claimed.lease, "null")
    assert Job.objects.get(pk=claimed.id).status == JobStatus.PENDING


def test_reaper_and_completion_racing_never_both_win(store, make_store):
    for _ in range(20):
        job = store.enqueue(JobSpec("tests.tasks.noop")).job
        (claimed,) = store.claim("w", ["default"], per_queue=1, lease_seconds=30)
        _expire(store, job.pk)
        reaper, completer = make_store(), make_store()
        outcome = {}
        barrier = threading.Barrier(2)

        def reap(reaper=reaper, outcome=outcome, barrier=barrier):
            barrier.wait()
            outcome["reaped"] = [r.job_id for r in reaper.reap_expired()]

        def complete(completer=completer, outcome=outcome, barrier=barrier, lease=claimed.lease):
            barrier.wait()
            try:
                completer.complete_if_leased(lease, "1")
                outcome["completed"] = True
            except LeaseLost:
                outcome["completed"] = False

        threads = [threading.Thread(target=reap), threading.Thread(target=complete)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=10)
        final = Job.objects.get(pk=job.pk).status
        assert outcome["completed"] != bool(outcome["reaped"])
        assert final == (JobStatus.SUCCEEDED if outcome["completed"] else JobStatus.PENDING)
        LiveJob.objects.all().delete()
        HistoryJob.objects.all().delete()


def test_failures_back_off_exponentially_on_the_database_clock(store):
    policy = RetryPolicy(base_seconds=10, max_seconds=35, jitter=0.2)
    store.enqueue(JobSpec("tests.tasks.noop", max_attempts=5))
    conn = store.runner.connection
    for attempt in (1, 2, 3, 4):
        conn.execute("UPDATE django_pgqueue_job SET available_at = now()")
        (claimed,) = store.claim("w", ["default"], per_queue=1, lease_seconds=30)
        outcome = store.fail_if_leased(claimed.lease, Failure("E", f"fail {attempt}"), policy)
        assert outcome.status == JobStatus.PENDING
        delay = (outcome.available_at - claimed.claimed_at).total_seconds()
        low, high = policy.bounds(attempt)
        assert low - 1 <= delay <= high + 1, (attempt, delay)
    assert policy.bounds(4) == (35 * 0.8, 35 * 1.2)  # capped


def test_failing_the_last_attempt_dead_letters_with_full_history(store):
    store.enqueue(JobSpec("tests.tasks.noop", max_attempts=2))
    conn = store.runner.connection
    for attempt in (1, 2):
        conn.execute("UPDATE django_pgqueue_job SET available_at = now()")
        (claimed,) = store.claim(f"w{attempt}", ["default"], per_queue=1, lease_seconds=30)
        outcome = store.fail_if_leased(
            claimed.lease, Failure("builtins.ValueError", f"bad {attempt}", f"Traceback {attempt}")
        )
    assert outcome.status == JobStatus.DEAD_LETTER
    job = Job.objects.get(pk=claimed.id)
    assert job.finished_at is not None
    assert job.last_error == "bad 2"
    assert [(e["attempt"], e["worker"], e["message"], e["traceback"]) for e in job.errors] == [
        (1, "w1", "bad 1", "Traceback 1"),
        (2, "w2", "bad 2", "Traceback 2"),
    ]
    assert all(e["exception_class"] == "builtins.ValueError" and e["at"] for e in job.errors)


def test_a_permanent_failure_dead_letters_at_once(store):
    store.enqueue(JobSpec("tests.tasks.noop", max_attempts=10))
    (claimed,) = store.claim("w", ["default"], per_queue=1, lease_seconds=30)
    outcome = store.fail_if_leased(claimed.lease, Failure("E", "no", permanent=True))
    assert (outcome.status, outcome.attempts) == (JobStatus.DEAD_LETTER, 1)


def test_reaping_is_bounded_by_its_limit(store):
    store.enqueue_many([JobSpec("tests.tasks.noop") for _ in range(5)])
    store.claim("w", ["default"], per_queue=5, lease_seconds=30)
    store.runner.connection.execute(
        "UPDATE django_pgqueue_job SET lease_expires_at = now() - interval '1 second'"
    )
    assert len(store.reap_expired(limit=3)) == 3
    assert len(store.reap_expired(limit=3)) == 2
