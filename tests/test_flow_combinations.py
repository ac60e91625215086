"""Limits hold for every way a job can become ready, not only a plain enqueue.

A coalesced job, a job made pending by its last blocker, and a cancelled running job
all go through statements other than the plain enqueue and the worker's completion;
each must keep its concurrency key's row right, or a limit leaks (too many in flight)
or starves (a free slot never used).
"""

from __future__ import annotations

import pytest

from django_pgqueue.models import Job
from django_pgqueue.states import JobStatus
from django_pgqueue.store.values import JobSpec

pytestmark = pytest.mark.timeout(60)


def _claim(store, queue: str = "default") -> list[int]:
    return [job.id for job in store.claim("w", [queue], per_queue=50, lease_seconds=30)]


def _limited(**options) -> JobSpec:
    return JobSpec("tests.tasks.noop", concurrency_key="api", concurrency_limit=1, **options)


def test_coalesced_jobs_count_against_their_concurrency_key(store):
    first = store.enqueue(_limited(coalesce_key="reindex:1")).id
    second = store.enqueue(_limited(coalesce_key="reindex:2")).id
    again = store.enqueue(_limited(coalesce_key="reindex:1")).id
    assert again == first
    assert Job.objects.get(pk=first).concurrency_key == "api"
    claimed = _claim(store)
    assert claimed == [first], "a limit of 1 lets exactly one of the two keys' jobs start"
    assert _claim(store) == []
    job = Job.objects.get(pk=first)
    assert job.status == JobStatus.PROCESSING
    assert Job.objects.get(pk=second).status == JobStatus.PENDING


def test_a_dependent_made_pending_by_its_blocker_respects_its_limit(store):
    blocker = store.enqueue(JobSpec("tests.tasks.noop", queue="emails")).id
    dependents = [store.enqueue(_limited(after=[blocker])).id for _ in range(3)]
    assert {Job.objects.get(pk=pk).status for pk in dependents} == {JobStatus.BLOCKED}
    (lease,) = store.claim("w", ["emails"], per_queue=1, lease_seconds=30)
    store.complete_if_leased(lease.lease, "null")
    assert {Job.objects.get(pk=pk).status for pk in dependents} == {JobStatus.PENDING}
    # The settling trigger made them pending: their key's row must know, and let one run.
    first = _claim(store)
    assert len(first) == 1
    assert first[0] in dependents
    assert _claim(store) == []


def test_cancelling_a_running_limited_job_keeps_its_slot_until_its_handler_returns(store):
    running = store.enqueue(_limited()).id
    waiting = store.enqueue(_limited()).id
    (lease,) = store.claim("w", ["default"], per_queue=50, lease_seconds=30)
    assert lease.id == running
    assert _claim(store) == []
    assert store.cancel([running]).running == (running,)
    # Its handler may still run: the slot stays taken.
    assert _claim(store) == []
    # The handler returned: its outcome ends the job cancelled and frees the slot.
    assert store.complete_many_outcomes("w", [(lease.lease, '"late"')]) == {
        running: JobStatus.CANCELLED
    }
    assert Job.objects.get(pk=running).result is None
    assert _claim(store) == [waiting]
