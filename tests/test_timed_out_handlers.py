"""A sync handler past its timeout still occupies its slot and its partition until it returns.

Python cannot stop a thread: a sync handler that ignores cancellation runs on after its
timeout. Until it really returns, the next job of its partition must not start (two jobs
of one partition never run at once) and the worker must not start more handlers than
its concurrency.
"""

from __future__ import annotations

import pytest

from django_pgqueue.models import Job
from django_pgqueue.states import JobStatus
from django_pgqueue.store.values import JobSpec
from tests import ledger
from tests.workers import wait_for

pytestmark = pytest.mark.timeout(120)

FINISHED = (JobStatus.SUCCEEDED, JobStatus.DEAD_LETTER)


def _moment(observer, job_id: int, event: str):
    (entry,) = [e for e in ledger.entries(observer, job_id) if e["event"] == event]
    return entry["at"]


def _wait_finished(job_ids: list[int]) -> None:
    wait_for(
        lambda: Job.objects.filter(pk__in=job_ids, status__in=FINISHED).count() == len(job_ids),
        timeout=60,
        message=f"jobs {job_ids} to finish",
    )


def test_the_next_job_of_a_partition_waits_for_a_timed_out_handler_to_return(workers, observer):
    stubborn, following = (
        job.pk
        for job in Job.objects.enqueue_many(
            [
                # Times out after 1 s, returns after 4 s.
                JobSpec(
                    "tests.tasks.ledger_stubborn",
                    kwargs={"seconds": 4},
                    partition_key="account-1",
                    max_attempts=1,
                ),
                JobSpec("tests.tasks.ledger_sleep", partition_key="account-1"),
            ]
        )
    )
    worker = workers("--concurrency", "4", "--poll-interval", "0.1")
    _wait_finished([stubborn, following])
    # Wait for the stubborn handler's own end (the job is dead-lettered before it).
    wait_for(
        lambda: any(e["event"] == "end" for e in ledger.entries(observer, stubborn)),
        timeout=30,
        message="the stubborn handler to return",
    )
    assert Job.objects.get(pk=stubborn).last_error_class == "django_pgqueue.exceptions.JobTimeout"
    ended = _moment(observer, stubborn, "end")
    started = _moment(observer, following, "start")
    assert started >= ended, (
        f"the next job of the partition started {(ended - started).total_seconds():.2f}s "
        f"before the timed-out handler returned\n{worker.output()}"
    )


def test_a_timed_out_handler_keeps_its_slot_until_it_returns(workers, observer):
    stubborn = Job.objects.enqueue(
        "tests.tasks.ledger_stubborn", kwargs={"seconds": 4}, max_attempts=1
    ).pk
    worker = workers("--concurrency", "1", "--poll-interval", "0.1")
    wait_for(
        lambda: ledger.entries(observer, stubborn), timeout=30, message="the stubborn job to start"
    )
    others = [
        job.pk
        for job in Job.objects.enqueue_many(
            [JobSpec("tests.tasks.ledger_sleep", kwargs={"seconds": 0.01}) for _ in range(3)]
        )
    ]
    _wait_finished([stubborn, *others])
    wait_for(
        lambda: any(e["event"] == "end" for e in ledger.entries(observer, stubborn)),
        timeout=30,
        message="the stubborn handler to return",
    )
    ended = _moment(observer, stubborn, "end")
    early = [job_id for job_id in others if _moment(observer, job_id, "start") < ended]
    assert not early, (
        f"with --concurrency 1, jobs {early} started while the timed-out handler still ran\n"
        f"{worker.output()}"
    )
