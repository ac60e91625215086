"""Features acting on the same job or key at once: each combination that once broke.

Cancel with limits and partitions, retries with coalescing and dependencies, dependents
inside partitions, completion batches sharing dependents, a backlog of signals, and a
dependency on another database. Real PostgreSQL, the store's own statements; the worker
level of the same combinations is in ``test_composition_workers.py``.
"""

from __future__ import annotations

import threading

import pytest
from django.db.models import F

from django_pgqueue.models import HistoryJob, Job, LiveJob
from django_pgqueue.states import JobStatus
from django_pgqueue.store.retry import RetryPolicy
from django_pgqueue.store.values import Failure, JobSpec
from django_pgqueue.worker.connection import ConnectionSlot
from django_pgqueue.worker.housekeeping import run_pass

pytestmark = pytest.mark.timeout(120)

NOW = RetryPolicy(base_seconds=0, max_seconds=0, jitter=0)


def _ids(claimed) -> list[int]:
    return sorted(job.id for job in claimed)


def _claim(store, queues=("default",), limit=50):
    return store.claim("w", list(queues), per_queue=limit, lease_seconds=30)


def _status(job_id: int) -> JobStatus:
    return JobStatus(Job.objects.get(pk=job_id).status)


# ---------------------------------------------------------------- coalescing + retries
def _coalesced(**options) -> JobSpec:
    return JobSpec("tests.tasks.noop", coalesce_key="reindex:1", max_attempts=3, **options)


def _twins(store):
    """A coalesced job that started, and the newer twin holding its key since."""
    first = store.enqueue(_coalesced()).id
    (lease,) = _claim(store)
    assert lease.id == first
    twin = store.enqueue(_coalesced()).id
    assert twin != first  # the key was free once the first started
    return lease, twin


@pytest.mark.parametrize("how", ["fail", "release", "release_many", "reap", "operator"])
def test_a_started_coalesced_job_goes_back_to_pending_beside_its_twin(store, how):
    lease, twin = _twins(store)
    first = lease.id
    if how == "fail":
        assert store.fail_if_leased(lease.lease, Failure("E", "boom"), NOW).status == "pending"
    elif how == "release":
        store.release_if_leased(lease.lease)
    elif how == "release_many":
        assert store.release_many_if_leased("w", [lease.lease]) == {first}
    elif how == "reap":
        LiveJob.objects.filter(pk=first).update(lease_expires_at=F("claimed_at"))
        (reaped,) = store.reap_expired(job_ids=[first], policy=NOW)
        assert reaped.status == JobStatus.PENDING
    else:
        store.fail_if_leased(lease.lease, Failure("E", "boom", permanent=True))
        assert store.retry([first]).done == (first,)
    # Both wait; the one that ran let go of the key, the twin keeps it.
    assert (_status(first), _status(twin)) == (JobStatus.PENDING, JobStatus.PENDING)
    assert Job.objects.get(pk=first).coalesce_key is None
    assert store.enqueue(_coalesced()).id == twin
    assert _ids(_claim(store)) == sorted([first, twin])


def test_a_cancelled_coalesced_job_retried_beside_its_twin(store):
    first = store.enqueue(_coalesced()).id
    assert store.cancel([first]).done == (first,)
    twin = store.enqueue(_coalesced()).id
    assert store.retry([first]).done == (first,)
    assert (_status(first), _status(twin)) == (JobStatus.PENDING, JobStatus.PENDING)
    assert store.enqueue(_coalesced()).id == twin


def test_housekeeping_reaps_every_dead_workers_jobs_beside_a_coalesced_twin(store, db_url):
    lease, twin = _twins(store)
    other = store.enqueue(JobSpec("tests.tasks.noop", queue="emails")).id
    _claim(store, queues=("emails",))
    LiveJob.objects.filter(pk__in=[lease.id, other]).update(lease_expires_at=F("claimed_at"))
    slot = ConnectionSlot("default", "test housekeeping")
    try:
        report = run_pass(slot, worker_timeout=30)
    finally:
        slot.close()
    assert report.reaped == 2
    assert {_status(lease.id), _status(other), _status(twin)} == {JobStatus.PENDING}


def test_a_coalesced_partition_keeps_its_order_after_a_retry(store):
    first = store.enqueue(_coalesced(partition_key="doc-1")).id
    (lease,) = _claim(store)
    twin = store.enqueue(_coalesced(partition_key="doc-1")).id
    store.fail_if_leased(lease.lease, Failure("E", "boom"), NOW)
    # The retried first job is older: it runs first, then its twin; never both at once.
    assert _ids(_claim(store)) == [first]
    assert _claim(store) == []
    (again,) = Job.objects.filter(pk=first)
    store.complete_many_if_leased("w", [(_lease_of(again), "null")])
    assert _ids(_claim(store)) == [twin]


def _lease_of(job: Job):
    from django_pgqueue.store.values import Lease

    return Lease(job.pk, job.lease_generation, job.claimed_by)


# ---------------------------------------------------------------- cancel + limits
def test_a_cancelled_running_job_cannot_be_retried_beside_its_handler(store):
    job = store.enqueue(JobSpec("tests.tasks.noop", max_attempts=1)).id
    (lease,) = _claim(store)
    assert store.cancel([job]).running == (job,)
    # "Retry now" right after the cancel: the handler may still run, so nothing happens.
    assert store.retry([job]).done == ()
    assert _claim(store) == []
    store.complete_many_if_leased("w", [(lease.lease, "null")])
    assert _status(job) == JobStatus.CANCELLED
    assert store.retry([job]).done == (job,)
    (again,) = _claim(store)
    assert again.id == job
    assert again.lease_generation > lease.lease_generation


def test_a_cancel_of_a_running_rate_limited_job_keeps_its_slot_and_spends_no_token(store):
    spec = JobSpec(
        "tests.tasks.noop", concurrency_key="api", concurrency_limit=1, rate_limit="100/s"
    )
    running = store.enqueue(spec).id
    waiting = store.enqueue(spec).id
    (lease,) = _claim(store)
    assert lease.id == running
    store.cancel([running])
    assert _claim(store) == []
    store.fail_if_leased(lease.lease, Failure("E", "stopped"), NOW)
    assert _status(running) == JobStatus.CANCELLED
    assert _ids(_claim(store)) == [waiting]


# ---------------------------------------------------------------- dependencies + retries
def test_retrying_a_cancelled_dependent_waits_for_its_unfinished_blocker(store):
    blocker = store.enqueue(JobSpec("tests.tasks.noop", queue="emails")).id
    dependent = store.enqueue(JobSpec("tests.tasks.noop", after=[blocker])).id
    assert store.cancel([dependent]).done == (dependent,)
    assert store.retry([dependent]).done == (dependent,)
    assert _status(dependent) == JobStatus.BLOCKED
    # One claim never takes a dependent together with the job it runs after.
    assert _ids(_claim(store, queues=("default", "emails"))) == [blocker]
    (lease,) = Job.objects.filter(pk=blocker)
    store.complete_many_if_leased("w", [(_lease_of(lease), "null")])
    assert _status(dependent) == JobStatus.PENDING
    assert _ids(_claim(store)) == [dependent]


def test_retrying_a_dependent_whose_blocker_failed_for_good_leaves_it_cancelled(store):
    blocker = store.enqueue(JobSpec("tests.tasks.noop", max_attempts=1)).id
    dependent = store.enqueue(JobSpec("tests.tasks.noop", after=[blocker])).id
    (lease,) = _claim(store)
    store.fail_if_leased(lease.lease, Failure("E", "boom"), NOW)
    assert _status(dependent) == JobStatus.CANCELLED
    result = store.retry([dependent])
    assert (result.done, result.skipped) == ((), (dependent,))
    assert _status(dependent) == JobStatus.CANCELLED
    # Retrying the blocker with its dependents is the way back.
    assert store.retry([blocker], revive_dependents=True).done == (blocker,)
    assert _status(dependent) == JobStatus.BLOCKED


def test_retrying_a_blocker_and_its_dependent_together_keeps_their_order(store):
    blocker = store.enqueue(JobSpec("tests.tasks.noop", max_attempts=1)).id
    dependent = store.enqueue(JobSpec("tests.tasks.noop", after=[blocker])).id
    (lease,) = _claim(store)
    store.fail_if_leased(lease.lease, Failure("E", "boom"), NOW)
    assert store.retry([blocker, dependent]).done == (blocker, dependent)
    assert (_status(blocker), _status(dependent)) == (JobStatus.PENDING, JobStatus.BLOCKED)


def test_retry_with_revived_dependents_is_one_transaction(store, make_store, monkeypatch):
    blocker = store.enqueue(JobSpec("tests.tasks.noop", max_attempts=1)).id
    dependent = store.enqueue(JobSpec("tests.tasks.noop", after=[blocker])).id
    (lease,) = _claim(store)
    store.fail_if_leased(lease.lease, Failure("E", "boom"), NOW)
    worker = make_store()
    seen: list[list[int]] = []
    revive = type(store).revive_dependents

    def between(self, job_ids):
        # A worker between the two statements: the retried blocker is not visible yet,
        # so it cannot finish before its dependent is blocked again.
        seen.append([job.id for job in _claim(worker)])
        return revive(self, job_ids)

    monkeypatch.setattr(type(store), "revive_dependents", between)
    assert store.retry([blocker], revive_dependents=True).done == (blocker,)
    assert seen == [[]]
    (again,) = _claim(worker)
    worker.complete_many_if_leased("w", [(again.lease, "null")])
    assert _status(dependent) == JobStatus.PENDING


def test_a_failing_revive_rolls_the_retry_back(store, monkeypatch):
    blocker = store.enqueue(JobSpec("tests.tasks.noop", max_attempts=1)).id
    store.enqueue(JobSpec("tests.tasks.noop", after=[blocker]))
    (lease,) = _claim(store)
    store.fail_if_leased(lease.lease, Failure("E", "boom"), NOW)

    def broken(self, job_ids):
        raise RuntimeError("revive failed")

    monkeypatch.setattr(type(store), "revive_dependents", broken)
    with pytest.raises(RuntimeError):
        store.retry([blocker], revive_dependents=True)
    assert _status(blocker) == JobStatus.DEAD_LETTER


# ---------------------------------------------------------------- dependencies + partitions
def test_a_blocked_job_keeps_its_partitions_turn(store):
    blocker = store.enqueue(JobSpec("tests.tasks.noop", queue="emails")).id
    waiting = store.enqueue(JobSpec("tests.tasks.noop", partition_key="p", after=[blocker])).id
    younger = store.enqueue(JobSpec("tests.tasks.noop", partition_key="p")).id
    # The partition waits for its blocked head, as for a running job.
    assert _claim(store) == []
    (lease,) = _claim(store, queues=("emails",))
    store.complete_many_if_leased("w", [(lease.lease, "null")])
    assert _ids(_claim(store)) == [waiting]
    assert _claim(store) == []
    (running,) = Job.objects.filter(pk=waiting)
    store.complete_many_if_leased("w", [(_lease_of(running), "null")])
    assert _ids(_claim(store)) == [younger]


def test_a_blocked_head_cancelled_by_its_blocker_lets_the_partition_move_on(store):
    blocker = store.enqueue(JobSpec("tests.tasks.noop", queue="emails", max_attempts=1)).id
    waiting = store.enqueue(JobSpec("tests.tasks.noop", partition_key="p", after=[blocker])).id
    younger = store.enqueue(JobSpec("tests.tasks.noop", partition_key="p")).id
    assert _claim(store) == []
    (lease,) = _claim(store, queues=("emails",))
    store.fail_if_leased(lease.lease, Failure("E", "boom"), NOW)
    assert _status(waiting) == JobStatus.CANCELLED
    assert _ids(_claim(store)) == [younger]


# ---------------------------------------------------------------- completion batches
def test_completion_batches_sharing_dependents_never_deadlock(make_store):
    # Each batch completes its blockers in its own order; every dependent waits for
    # blockers of every batch. A deadlock raises DeadlockDetected in one of them.
    stores = [make_store() for _ in range(4)]
    for round_ in range(12):
        blockers = [stores[0].enqueue(JobSpec("tests.tasks.noop")).id for _ in range(40)]
        # Fan-in: every dependent waits for blockers spread over all the batches.
        for start in range(10):
            stores[0].enqueue(
                JobSpec("tests.tasks.noop", queue="emails", after=blockers[start::10])
            )
        leases = [job.lease for job in _claim(stores[0], limit=100)]
        assert len(leases) == 40
        # Each batch completes its blockers in its own order (two ascending, two
        # descending): their settling triggers reach shared dependents in crossing orders.
        batches = [
            leases[index::4] if index % 2 else list(reversed(leases[index::4]))
            for index in range(4)
        ]
        barrier = threading.Barrier(4)
        errors: list[BaseException] = []
        threads = [
            threading.Thread(target=_complete_at_once, args=(store, batch, barrier, errors))
            for store, batch in zip(stores, batches, strict=True)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert not errors, f"round {round_}: {errors}"
        assert Job.objects.filter(queue="emails", status=JobStatus.BLOCKED).count() == 0
        LiveJob.objects.filter(queue="emails").delete()
        HistoryJob.objects.all().delete()


def _complete_at_once(store, batch, barrier: threading.Barrier, errors: list) -> None:
    try:
        barrier.wait(10)
        store.complete_many_if_leased("w", [(lease, "null") for lease in batch])
    except BaseException as error:
        errors.append(error)
