"""Claim rounds: every served queue is looked at, even with fewer free slots than queues.

An empty answer from one queue must neither end ``--burst`` while another served queue
has ready jobs nor put a long-running worker to sleep for a poll interval.
"""

from __future__ import annotations

import pytest

from django_pgqueue.models import Job
from django_pgqueue.states import JobStatus
from django_pgqueue.store.values import JobSpec
from tests.workers import wait_for

pytestmark = pytest.mark.timeout(120)


def _enqueue(spread: dict[str, int]) -> list[int]:
    specs = [
        JobSpec("tests.tasks.noop", queue=queue) for queue, n in spread.items() for _ in range(n)
    ]
    return [job.pk for job in Job.objects.enqueue_many(specs)]


@pytest.mark.parametrize(
    "spread",
    [
        pytest.param({"default": 0, "emails": 21}, id="first-queue-empty"),
        pytest.param({"default": 1, "emails": 20}, id="first-queue-empties-early"),
        pytest.param({"default": 20, "emails": 1}, id="second-queue-empties-early"),
    ],
)
def test_burst_with_one_slot_and_two_queues_runs_every_ready_job(workers, spread):
    ids = _enqueue(spread)
    worker = workers("--queue", "default", "--queue", "emails", "--concurrency", "1", "--burst")
    assert worker.wait(60) == 0, worker.output()
    done = Job.objects.filter(pk__in=ids, status=JobStatus.SUCCEEDED).count()
    assert done == len(ids) == 21, f"--burst exited after {done} of 21 ready jobs"


def test_an_empty_queue_does_not_put_the_worker_to_sleep_for_a_poll_interval(workers, observer):
    worker = workers(
        "--queue",
        "default",
        "--queue",
        "emails",
        "--queue",
        "low",
        "--concurrency",
        "1",
        "--poll-interval",
        "60",
    )
    worker.wait_registered(observer)
    ids = _enqueue({"default": 1, "emails": 0, "low": 5})
    # A liveness bound, far below the 60 s poll interval the worker would sleep.
    try:
        wait_for(lambda: _succeeded(ids) == 6, timeout=15)
    except AssertionError:
        raise AssertionError(
            f"{_succeeded(ids)} of 6 ready jobs over 3 queues ran within 15 s (poll interval 60 s)"
        ) from None


def _succeeded(ids: list[int]) -> int:
    return Job.objects.filter(pk__in=ids, status=JobStatus.SUCCEEDED).count()
