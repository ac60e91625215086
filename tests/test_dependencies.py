"""Dependencies (after=): blocked jobs, settling by the trigger, policies, revive."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from django_pgqueue.exceptions import InvalidOption, UnknownDependency
from django_pgqueue.models import Dependency, Job
from django_pgqueue.states import BlockerFailure, JobStatus
from django_pgqueue.store.queue import QueueStore
from django_pgqueue.store.runners import PsycopgRunner
from django_pgqueue.store.values import Failure, JobSpec
from tests.workers import wait_for

pytestmark = pytest.mark.timeout(60)


def _run(store, job_id, *, fail=False):
    """Claim ``job_id`` (alone in its queue) and complete or dead-letter it."""
    (claimed,) = [
        job
        for job in store.claim(
            "w", [Job.objects.get(pk=job_id).queue], per_queue=50, lease_seconds=30
        )
        if job.id == job_id
    ] or [None]
    assert claimed is not None, f"job {job_id} was not claimable"
    if fail:
        store.fail_if_leased(claimed.lease, Failure("E", "boom", permanent=True))
    else:
        store.complete_if_leased(claimed.lease, f'{{"from": {job_id}}}')
    return claimed


def _status(job_id):
    return Job.objects.get(pk=job_id).status


def test_a_dependent_is_blocked_until_its_last_blocker_succeeds(store):
    first = store.enqueue(JobSpec("tests.tasks.noop", queue="a")).id
    second = store.enqueue(JobSpec("tests.tasks.noop", queue="b")).id
    dependent = store.enqueue(JobSpec("tests.tasks.noop", queue="c", after=[first, second]))
    assert dependent.snapshot.status == JobStatus.BLOCKED
    assert _status(dependent.id) == JobStatus.BLOCKED
    assert store.claim("w", ["c"], per_queue=10, lease_seconds=30) == []
    _run(store, first)
    assert _status(dependent.id) == JobStatus.BLOCKED
    _run(store, second)
    assert _status(dependent.id) == JobStatus.PENDING
    (claimed,) = store.claim("w", ["c"], per_queue=10, lease_seconds=30)
    assert claimed.id == dependent.id
    edges = list(Dependency.objects.filter(job_id=dependent.id).order_by("position"))
    assert [(edge.blocker_id, edge.position) for edge in edges] == [(first, 0), (second, 1)]


def test_after_succeeded_jobs_is_pending_and_unknown_ids_write_nothing(store):
    done = store.enqueue(JobSpec("tests.tasks.noop")).id
    _run(store, done)
    ready = store.enqueue(JobSpec("tests.tasks.noop", after=[done]))
    assert _status(ready.id) == JobStatus.PENDING
    before = Job.objects.count()
    with pytest.raises(UnknownDependency) as raised:
        store.enqueue(JobSpec("tests.tasks.noop", after=[done, 987654321]))
    assert raised.value.job_ids == [987654321]
    assert Job.objects.count() == before
    assert Dependency.objects.count() == 1
    with pytest.raises(InvalidOption):
        store.enqueue(JobSpec("tests.tasks.noop", after=["nope"]))
    with pytest.raises(InvalidOption):
        store.enqueue(JobSpec("tests.tasks.noop", after=[done], on_blocker_failure="later"))


def test_a_dead_blocker_cancels_dependents_transitively_with_the_reason(store):
    blocker = store.enqueue(JobSpec("tests.tasks.noop", queue="a", max_attempts=1)).id
    child = store.enqueue(JobSpec("tests.tasks.noop", queue="b", after=[blocker])).id
    grandchild = store.enqueue(JobSpec("tests.tasks.noop", queue="b", after=[child])).id
    runs_anyway = store.enqueue(
        JobSpec("tests.tasks.noop", queue="c", after=[blocker], on_blocker_failure="run")
    ).id
    _run(store, blocker, fail=True)
    assert _status(blocker) == JobStatus.DEAD_LETTER
    cancelled = Job.objects.get(pk=child)
    assert cancelled.status == JobStatus.CANCELLED
    assert cancelled.last_error == f"job {blocker}, which it runs after, ended dead-letter"
    assert cancelled.finished_at is not None
    assert Job.objects.get(pk=grandchild).last_error == (
        f"job {child}, which it runs after, ended cancelled"
    )
    assert _status(runs_anyway) == JobStatus.PENDING
    assert store.cancelled_dependents([blocker]) == {blocker: [child]}
    # Enqueued after a job that is dead already: the policy applies at once.
    late = store.enqueue(JobSpec("tests.tasks.noop", queue="b", after=[blocker]))
    assert late.snapshot.status == JobStatus.CANCELLED
    assert _status(late.id) == JobStatus.CANCELLED
    # Retry with revive: the whole cancelled subtree waits again, and runs in order.
    outcome = store.retry([blocker], revive_dependents=True)
    assert outcome.done == (blocker,)
    assert {_status(job) for job in (child, grandchild, late.id)} == {JobStatus.BLOCKED}
    assert Job.objects.get(pk=child).last_error is None
    _run(store, blocker)
    assert _status(child) == JobStatus.PENDING
    assert _status(grandchild) == JobStatus.BLOCKED
    _run(store, child)
    assert _status(grandchild) == JobStatus.PENDING


def test_operator_cancel_of_a_blocked_job_settles_its_dependents(store):
    blocker = store.enqueue(JobSpec("tests.tasks.noop")).id
    blocked = store.enqueue(JobSpec("tests.tasks.noop", after=[blocker])).id
    dependent = store.enqueue(JobSpec("tests.tasks.noop", after=[blocked])).id
    assert store.cancel([blocked], reason="not needed").done == (blocked,)
    assert _status(dependent) == JobStatus.CANCELLED
    assert store.retry([blocked], revive_dependents=True).done == (blocked,)
    assert _status(dependent) == JobStatus.BLOCKED


def test_enqueue_many_mixes_plain_and_dependent_specs(store):
    blocker = store.enqueue(JobSpec("tests.tasks.noop")).id
    outcomes = store.enqueue_many(
        [
            JobSpec("tests.tasks.noop"),
            JobSpec("tests.tasks.noop", after=[blocker]),
            JobSpec("tests.tasks.noop", after=[blocker], on_blocker_failure=BlockerFailure.RUN),
        ]
    )
    assert [o.snapshot.status for o in outcomes] == [
        JobStatus.PENDING,
        JobStatus.BLOCKED,
        JobStatus.BLOCKED,
    ]


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_enqueue_leaves_nothing():
    with pytest.raises(RuntimeError), transaction.atomic():
        first = Job.objects.enqueue("tests.tasks.noop")
        Job.objects.enqueue("tests.tasks.noop", after=[first.pk])
        raise RuntimeError
    assert not Job.objects.exists()
    assert not Dependency.objects.exists()
    assert connection.in_atomic_block is False


def _lock_waiters(observer, application_name):
    return observer.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND application_name = %s",
        [application_name],
    ).fetchone()[0]


def test_two_blockers_finishing_in_concurrent_transactions_unblock_the_job(
    store, open_connection, observer
):
    first = store.enqueue(JobSpec("tests.tasks.noop", queue="a")).id
    second = store.enqueue(JobSpec("tests.tasks.noop", queue="b")).id
    dependent = store.enqueue(JobSpec("tests.tasks.noop", queue="c", after=[first, second])).id
    (lease_a,) = store.claim("w1", ["a"], per_queue=1, lease_seconds=30)
    (lease_b,) = store.claim("w2", ["b"], per_queue=1, lease_seconds=30)
    one = open_connection(application_name="settle-one")
    two = open_connection(application_name="settle-two")
    store_one = QueueStore(PsycopgRunner(one, "default"))
    store_two = QueueStore(PsycopgRunner(two, "default"))
    one.execute("BEGIN")
    store_one.complete_if_leased(lease_a.lease, "1")  # holds the dependent's row lock
    two.execute("BEGIN")
    finished = threading.Event()

    def complete_second():
        store_two.complete_if_leased(lease_b.lease, "2")
        two.execute("COMMIT")
        finished.set()

    thread = threading.Thread(target=complete_second)
    thread.start()
    # The second settler waits for the first one's lock on the dependent...
    wait_for(lambda: _lock_waiters(observer, "settle-two"), timeout=10)
    assert not finished.is_set()
    one.execute("COMMIT")
    thread.join(10)
    # ...and then sees its commit: the job is not left blocked with both blockers done.
    assert finished.is_set()
    assert _status(dependent) == JobStatus.PENDING


def test_a_blocker_finishing_while_a_dependent_is_enqueued_waits_for_the_edge(
    store, open_connection, observer
):
    blocker = store.enqueue(JobSpec("tests.tasks.noop", queue="a")).id
    (claimed,) = store.claim("w1", ["a"], per_queue=1, lease_seconds=30)
    producer = open_connection(application_name="producer")
    producer.execute("BEGIN")
    dependent = QueueStore(PsycopgRunner(producer, "default")).enqueue(
        JobSpec("tests.tasks.noop", queue="c", after=[blocker])
    )
    assert dependent.snapshot.status == JobStatus.BLOCKED
    worker = open_connection(application_name="completer")
    done = threading.Event()

    def complete():
        QueueStore(PsycopgRunner(worker, "default")).complete_if_leased(claimed.lease, "1")
        done.set()

    thread = threading.Thread(target=complete)
    thread.start()
    wait_for(lambda: _lock_waiters(observer, "completer"), timeout=10)
    producer.execute("COMMIT")
    thread.join(10)
    assert done.is_set()
    assert _status(dependent.id) == JobStatus.PENDING


def test_a_thousand_step_chain_is_cancelled_and_revived_in_one_go(store):
    # The cascade is one statement, not a trigger firing level by level: no stack limit.
    ids = [store.enqueue(JobSpec("tests.tasks.noop")).id]
    for _ in range(1000):
        ids.append(store.enqueue(JobSpec("tests.tasks.noop", after=[ids[-1]])).id)
    assert store.cancel([ids[0]], reason="not needed").done == (ids[0],)
    assert Job.objects.filter(status=JobStatus.CANCELLED).count() == 1001
    assert Job.objects.get(pk=ids[-1]).last_error == (
        f"job {ids[-2]}, which it runs after, ended cancelled"
    )
    assert Job.objects.get(pk=ids[1]).last_error == (
        f"job {ids[0]}, which it runs after, ended cancelled"
    )
    store.retry([ids[0]], revive_dependents=True)
    assert Job.objects.filter(status=JobStatus.BLOCKED).count() == 1000
