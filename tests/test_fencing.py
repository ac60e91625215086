"""Lease fencing: only the current lease holder can finish, fail, extend or release a job."""

from __future__ import annotations

import datetime as dt

import pytest

from django_pgqueue.exceptions import LeaseLost
from django_pgqueue.models import Job
from django_pgqueue.states import JobStatus
from django_pgqueue.store.retry import RetryPolicy
from django_pgqueue.store.values import Failure, JobSpec, Lease

pytestmark = pytest.mark.timeout(60)

FAST_RETRY = RetryPolicy(base_seconds=0, max_seconds=0, jitter=0)


def _snapshot(job_id: int) -> dict:
    return Job.objects.filter(pk=job_id).values().get()


def _expire(store, job_id: int) -> None:
    store.runner.connection.execute(
        "UPDATE django_pgqueue_job SET lease_expires_at = now() - interval '1 second' "
        "WHERE id = %s",
        [job_id],
    )


@pytest.fixture
def taken_over(store):
    """A job whose lease expired under worker A and was re-claimed by worker B."""
    job = store.enqueue(JobSpec("tests.tasks.noop")).job
    (stale,) = store.claim("worker-a", ["default"], per_queue=1, lease_seconds=30)
    _expire(store, job.pk)
    reaped = store.reap_expired(policy=FAST_RETRY)
    assert [r.job_id for r in reaped] == [job.pk]
    (fresh,) = store.claim("worker-b", ["default"], per_queue=1, lease_seconds=30)
    assert fresh.id == stale.id
    assert fresh.lease_generation > stale.lease_generation
    assert fresh.attempts == 2
    return stale, fresh


STALE_OPERATIONS = {
    "complete": lambda store, lease: store.complete_if_leased(lease, '"stale"'),
    "fail": lambda store, lease: store.fail_if_leased(lease, Failure("E", "stale")),
    "extend": lambda store, lease: store.extend_lease_if_leased(lease, 300),
    "release": lambda store, lease: store.release_if_leased(lease),
    "set_step": lambda store, lease: store.set_step_if_leased(lease, "stale-step"),
}


@pytest.mark.parametrize("operation", sorted(STALE_OPERATIONS))
def test_a_stale_worker_changes_nothing_and_learns_it_lost(store, taken_over, operation):
    stale, fresh = taken_over
    before = _snapshot(fresh.id)
    with pytest.raises(LeaseLost) as caught:
        STALE_OPERATIONS[operation](store, stale.lease)
    assert caught.value.job_id == stale.id
    assert caught.value.lease_generation == stale.lease_generation
    assert _snapshot(fresh.id) == before


@pytest.mark.parametrize(
    "mismatch",
    [
        {"lease_generation": 99},
        {"worker_id": "someone-else"},
        {"job_id": 10**12},
    ],
)
def test_any_part_of_the_lease_must_match(store, mismatch):
    store.enqueue(JobSpec("tests.tasks.noop"))
    (claimed,) = store.claim("w", ["default"], per_queue=1, lease_seconds=30)
    fields = {
        "job_id": claimed.id,
        "lease_generation": claimed.lease_generation,
        "worker_id": claimed.worker_id,
    }
    fields.update(mismatch)
    before = _snapshot(claimed.id)
    with pytest.raises(LeaseLost):
        store.complete_if_leased(Lease(**fields), "null")
    assert _snapshot(claimed.id) == before


def test_batch_operations_apply_only_to_leases_still_held(store, taken_over):
    stale, fresh = taken_over
    other = store.enqueue(JobSpec("tests.tasks.noop")).job
    (mine,) = store.claim("worker-a", ["default"], per_queue=1, lease_seconds=30)
    assert mine.id == other.pk
    before = _snapshot(fresh.id)
    assert store.extend_leases_if_leased("worker-a", [stale.lease, mine.lease], 60).held_ids == {
        mine.id
    }
    assert store.release_many_if_leased("worker-a", [stale.lease]) == set()
    assert store.complete_many_if_leased(
        "worker-a", [(stale.lease, '"stale"'), (mine.lease, '"ok"')]
    ) == {mine.id}
    assert _snapshot(fresh.id) == before
    assert Job.objects.get(pk=mine.id).result == "ok"


def test_completions_sent_again_after_a_lost_acknowledgement_count_as_done(store, taken_over):
    """The recorder resends a batch when the connection drops; the first send may have
    committed. Jobs that succeeded under the same lease are done, not lost, and keep
    what the first send stored."""
    stale, fresh = taken_over
    store.enqueue(JobSpec("tests.tasks.noop"))
    (mine,) = store.claim("worker-b", ["default"], per_queue=1, lease_seconds=30)
    batch = [(fresh.lease, '"first"'), (mine.lease, '"first"')]
    assert store.complete_many_if_leased("worker-b", batch) == {fresh.id, mine.id}
    stored = {job_id: _snapshot(job_id) for job_id in (fresh.id, mine.id)}
    resent = [(fresh.lease, '"second"'), (mine.lease, '"second"')]
    assert store.complete_many_if_leased("worker-b", resent) == {fresh.id, mine.id}
    assert {job_id: _snapshot(job_id) for job_id in stored} == stored
    # Only that lease: not another worker naming it, not the older lease of the same job.
    assert store.complete_many_if_leased("worker-a", resent) == set()
    assert store.complete_many_if_leased("worker-a", [(stale.lease, '"stale"')]) == set()
    assert {job_id: _snapshot(job_id) for job_id in stored} == stored


def test_a_resent_completion_of_an_older_lease_of_the_same_worker_is_still_lost(store):
    """The same process re-claimed the job (a new generation) and completed it: its
    first lease's completion, sent late, is lost, not done."""
    job = store.enqueue(JobSpec("tests.tasks.noop")).job
    (first,) = store.claim("worker-a", ["default"], per_queue=1, lease_seconds=30)
    _expire(store, job.pk)
    assert [r.job_id for r in store.reap_expired(policy=FAST_RETRY)] == [job.pk]
    (second,) = store.claim("worker-a", ["default"], per_queue=1, lease_seconds=30)
    assert second.id == first.id
    assert second.lease_generation > first.lease_generation
    assert store.complete_many_if_leased("worker-a", [(second.lease, '"second"')]) == {job.pk}
    stored = _snapshot(job.pk)
    assert store.complete_many_if_leased("worker-a", [(first.lease, '"first"')]) == set()
    assert _snapshot(job.pk) == stored


def test_the_check_for_earlier_sends_runs_only_when_a_completion_comes_back_short(
    store, taken_over, monkeypatch
):
    stale, fresh = taken_over
    sent: list[str] = []
    run = store.runner.run
    monkeypatch.setattr(
        store.runner, "run", lambda query, params: sent.append(query.name) or run(query, params)
    )
    assert store.complete_many_if_leased("worker-b", [(fresh.lease, "null")]) == {fresh.id}
    assert sent == ["complete_many_if_leased"]  # a drain pays for one statement per batch
    assert store.complete_many_if_leased("worker-a", [(stale.lease, "null")]) == set()
    assert sent[1:] == ["complete_many_if_leased", "succeeded_under_leases"]


def test_the_current_holder_completes_and_a_second_completion_is_refused(store, taken_over):
    _, fresh = taken_over
    store.complete_if_leased(fresh.lease, '{"answer": 42}')
    job = Job.objects.get(pk=fresh.id)
    assert job.status == JobStatus.SUCCEEDED
    assert job.result == {"answer": 42}
    assert job.finished_at is not None
    assert job.lease_expires_at is None
    with pytest.raises(LeaseLost):
        store.complete_if_leased(fresh.lease, '"again"')
    assert Job.objects.get(pk=fresh.id).result == {"answer": 42}


def test_extending_moves_the_expiry_on_the_database_clock(store):
    store.enqueue(JobSpec("tests.tasks.noop"))
    (claimed,) = store.claim("w", ["default"], per_queue=1, lease_seconds=5)
    expires = store.extend_lease_if_leased(claimed.lease, 120)
    db_now = store.runner.connection.execute("SELECT now()").fetchone()[0]
    # Two autocommit statements: their now() differ by the time between them.
    assert dt.timedelta(seconds=115) < expires - db_now <= dt.timedelta(seconds=120)


def test_release_gives_back_the_attempt_and_bumps_the_generation(store):
    store.enqueue(JobSpec("tests.tasks.noop"))
    (claimed,) = store.claim("w", ["default"], per_queue=1, lease_seconds=30)
    store.release_if_leased(claimed.lease, reason="shutting down")
    job = Job.objects.get(pk=claimed.id)
    assert job.status == JobStatus.PENDING
    assert job.attempts == 0
    assert job.lease_generation == claimed.lease_generation + 1
    assert job.claimed_by is None
    assert job.last_error == "shutting down"
    with pytest.raises(LeaseLost):
        store.complete_if_leased(claimed.lease, "null")
    (again,) = store.claim("w", ["default"], per_queue=1, lease_seconds=30)
    assert again.attempts == 1
    assert again.lease_generation == claimed.lease_generation + 2


def test_set_step_records_progress_for_the_next_attempt(store):
    store.enqueue(JobSpec("tests.tasks.noop"))
    (claimed,) = store.claim("w", ["default"], per_queue=1, lease_seconds=30)
    store.set_step_if_leased(claimed.lease, "rendered")
    store.fail_if_leased(claimed.lease, Failure("E", "upload failed"), FAST_RETRY)
    (retry,) = store.claim("w", ["default"], per_queue=1, lease_seconds=30)
    assert retry.step == "rendered"
    assert retry.prior_workers == ["w"]
