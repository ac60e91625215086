"""Shutdown with real signals: drain, grace period, release, deregister, exit 0."""

from __future__ import annotations

import signal
import time

import pytest

from django_pgqueue.models import Job, Worker
from django_pgqueue.states import JobStatus, WorkerStatus
from django_pgqueue.store.values import JobSpec
from tests import ledger, tasks
from tests.workers import wait_for

pytestmark = pytest.mark.timeout(120)


def _started(observer, job_id):
    return any(e["event"] == "start" for e in ledger.entries(observer, int(job_id)))


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_during_a_short_job_lets_it_finish(workers, observer, signum):
    result = tasks.ledger_sleep.enqueue(seconds=1.0)
    worker = workers("--grace-seconds", "30")
    worker_id = worker.wait_registered(observer)
    wait_for(lambda: _started(observer, result.id), timeout=30)
    worker.send(signum)
    assert worker.wait(30) == 0, worker.output()
    job = Job.objects.get(pk=int(result.id))
    assert job.status == JobStatus.SUCCEEDED
    assert not Job.objects.filter(status=JobStatus.PROCESSING).exists()
    assert Worker.objects.get(pk=worker_id).status == WorkerStatus.DEAD


def test_job_longer_than_the_grace_period_is_released_not_stranded(workers, observer):
    result = tasks.ledger_sleep.enqueue(seconds=60)
    worker = workers("--grace-seconds", "1")
    worker_id = worker.wait_registered(observer)
    wait_for(lambda: _started(observer, result.id), timeout=30)
    worker.send(signal.SIGTERM)
    wait_for(
        lambda: (
            Worker.objects.filter(pk=worker_id, status=WorkerStatus.DRAINING).exists()
            or worker.process.poll() is not None
        ),
        timeout=10,
    )
    assert worker.wait(30) == 0, worker.output()
    job = Job.objects.get(pk=int(result.id))
    assert job.status == JobStatus.PENDING
    assert job.attempts == 0  # the attempt was given back
    assert job.lease_generation == 2  # claim, then release: a late completion is fenced
    assert job.claimed_by is None
    assert "shut down" in job.last_error
    assert Worker.objects.get(pk=worker_id).status == WorkerStatus.DEAD


def test_a_second_signal_releases_and_exits_at_once(workers, observer):
    result = tasks.ledger_sleep.enqueue(seconds=60)
    worker = workers("--grace-seconds", "600")
    worker.wait_registered(observer)
    wait_for(lambda: _started(observer, result.id), timeout=30)
    worker.send(signal.SIGTERM)
    time.sleep(0.3)  # let the first signal start draining; the second must cut it short
    worker.send(signal.SIGTERM)
    assert worker.wait(20) == 0, worker.output()
    assert Job.objects.get(pk=int(result.id)).status == JobStatus.PENDING


def test_an_idle_worker_exits_promptly_on_sigterm(workers, observer):
    worker = workers("--poll-interval", "30")
    worker_id = worker.wait_registered(observer)
    wait_for(
        lambda: observer.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
            [f"pgqueue listener {worker_id}"[:63]],
        ).fetchone()[0],
        timeout=10,
        message="the listener to connect",
    )
    started = time.monotonic()
    worker.send(signal.SIGTERM)
    assert worker.wait(10) == 0
    elapsed = time.monotonic() - started
    print(f"idle worker exited {elapsed:.3f}s after SIGTERM")
    assert Worker.objects.get(pk=worker_id).status == WorkerStatus.DEAD


def test_claimed_but_unstarted_jobs_are_released_at_once(workers, observer):
    first = tasks.ledger_sleep.enqueue(seconds=2)
    waiting = [tasks.ledger_sleep.enqueue(seconds=0) for _ in range(3)]
    worker = workers("--concurrency", "1", "--prefetch", "3", "--grace-seconds", "30")
    worker.wait_registered(observer)
    wait_for(lambda: _started(observer, first.id), timeout=30)
    worker.send(signal.SIGTERM)
    assert worker.wait(30) == 0
    assert Job.objects.get(pk=int(first.id)).status == JobStatus.SUCCEEDED
    for result in waiting:
        job = Job.objects.get(pk=int(result.id))
        if job.status == JobStatus.PENDING:  # prefetched and handed back untouched
            assert job.attempts == 0
            assert not _started(observer, result.id)
        else:  # claimed by a later batch after the first finished, before the signal
            assert job.status == JobStatus.SUCCEEDED


def test_max_jobs_and_burst_exit_zero_and_deregister(workers, observer):
    Job.objects.enqueue_many([JobSpec("tests.tasks.noop") for _ in range(5)])
    worker = workers("--burst")
    assert worker.wait() == 0
    (status,) = observer.execute(
        "SELECT status FROM django_pgqueue_worker WHERE pid = %s", [worker.pid]
    ).fetchone()
    assert status == "dead"
