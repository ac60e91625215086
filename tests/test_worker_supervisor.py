"""``runqueueworker --processes N``: several workers, restarted when they die."""

from __future__ import annotations

import signal

import psutil
import pytest

from django_pgqueue.models import Job, Worker
from django_pgqueue.states import JobStatus, WorkerStatus
from django_pgqueue.store.values import JobSpec
from tests.workers import wait_for

pytestmark = pytest.mark.timeout(120)


def _children(worker):
    return [child.pid for child in psutil.Process(worker.pid).children()]


def test_children_are_restarted_and_stopped_with_the_supervisor(workers, observer):
    supervisor = workers("--processes", "2", "--poll-interval", "0.1")
    first = wait_for(lambda: len(_children(supervisor)) == 2 and _children(supervisor), timeout=30)
    wait_for(
        lambda: Worker.objects.filter(pid__in=first, status=WorkerStatus.ALIVE).count() == 2,
        timeout=30,
    )
    victim = first[0]
    psutil.Process(victim).kill()
    replaced = wait_for(
        lambda: (pids := _children(supervisor)) and victim not in pids and len(pids) == 2 and pids,
        timeout=30,
        message="the supervisor to replace the killed worker",
    )
    Job.objects.enqueue_many([JobSpec("tests.tasks.noop") for _ in range(200)])
    wait_for(lambda: Job.objects.filter(status=JobStatus.SUCCEEDED).count() == 200, timeout=60)
    supervisor.send(signal.SIGTERM)
    assert supervisor.wait(30) == 0, supervisor.output()
    assert Worker.objects.filter(pid__in=replaced, status=WorkerStatus.DEAD).count() == 2
    assert "exited with -9; restarting" in supervisor.output()


def test_burst_supervisor_exits_when_every_child_is_done(workers):
    Job.objects.enqueue_many([JobSpec("tests.tasks.noop") for _ in range(100)])
    supervisor = workers("--processes", "2", "--burst")
    assert supervisor.wait(60) == 0, supervisor.output()
    assert Job.objects.filter(status=JobStatus.SUCCEEDED).count() == 100
