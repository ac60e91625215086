"""Crashes: kill -9 mid-job and after the handler returned, poison jobs, lost leases."""

from __future__ import annotations

import signal
import time

import pytest

from django_pgqueue.models import Job
from django_pgqueue.states import JobStatus
from django_pgqueue.store.values import JobSpec
from tests import ledger, tasks
from tests.workers import wait_for

pytestmark = pytest.mark.timeout(180)

# Short leases and frequent housekeeping, so recovery happens within seconds.
RECOVERY = {"HOUSEKEEPING_INTERVAL_SECONDS": 0.2, "RETRY_BASE_SECONDS": 0.05, "RETRY_JITTER": 0}
SHORT_LEASE = ("--lease-seconds", "1", "--poll-interval", "0.1")


def _events(observer, job_id):
    return ledger.entries(observer, int(job_id))


def test_kill_9_mid_job_another_worker_finishes_it_after_the_lease(workers, observer):
    result = tasks.ledger_sleep.enqueue(seconds=3, label="long")
    first = workers(*SHORT_LEASE, settings=RECOVERY)
    wait_for(lambda: _events(observer, result.id), timeout=30)
    first.kill()
    second = workers(*SHORT_LEASE, settings=RECOVERY)
    wait_for(lambda: Job.objects.get(pk=int(result.id)).status == JobStatus.SUCCEEDED, timeout=60)
    job = Job.objects.get(pk=int(result.id))
    events = _events(observer, job.pk)
    starts = [e for e in events if e["event"] == "start"]
    ends = [e for e in events if e["event"] == "end"]
    assert [e["worker_pid"] for e in starts] == [first.pid, second.pid]
    assert [e["worker_pid"] for e in ends] == [second.pid]  # the killed attempt never ended
    # Exactly one accepted completion: the second worker's, at the newer generation.
    assert job.result["pid"] == second.pid
    assert job.attempts == 2
    assert job.lease_generation == ends[0]["lease_generation"] == starts[0]["lease_generation"] + 1
    (history,) = job.errors
    assert history["exception_class"] == "django_pgqueue.exceptions.LeaseExpired"
    assert history["worker"].split(":")[1] == str(first.pid)


def test_kill_9_after_the_handler_returned_runs_again_and_only_the_rerun_counts(workers, observer):
    result = tasks.ledger_die_after_return.enqueue()
    first = workers(*SHORT_LEASE, settings=RECOVERY)
    assert first.wait(30) == -signal.SIGKILL  # killed between handler and completion
    ends = _events(observer, result.id)
    assert [e["attempt"] for e in ends] == [1]
    assert Job.objects.get(pk=int(result.id)).status == JobStatus.PROCESSING
    workers(*SHORT_LEASE, settings=RECOVERY)
    wait_for(lambda: Job.objects.get(pk=int(result.id)).status == JobStatus.SUCCEEDED, timeout=60)
    job = Job.objects.get(pk=int(result.id))
    ends = _events(observer, result.id)
    assert [e["attempt"] for e in ends] == [1, 2]
    assert job.result == "attempt 2"
    assert job.lease_generation == ends[1]["lease_generation"] == ends[0]["lease_generation"] + 1


def test_a_poison_job_ends_in_dead_letter_while_normal_jobs_finish(workers, observer):
    poison = tasks.ledger_poison.enqueue()
    normal = Job.objects.enqueue_many(
        [JobSpec("tests.tasks.ledger_sleep", kwargs={"seconds": 0.01}) for _ in range(50)]
    )
    normal_ids = [job.pk for job in normal]

    def settled() -> bool:
        return (
            Job.objects.get(pk=int(poison.id)).status == JobStatus.DEAD_LETTER
            and Job.objects.filter(pk__in=normal_ids, status=JobStatus.SUCCEEDED).count() == 50
        )

    worker = workers(*SHORT_LEASE, "--concurrency", "4", settings=RECOVERY)
    restarts = 0
    deadline = time.monotonic() + 120
    while not settled():
        assert time.monotonic() < deadline, "the queue did not settle"
        if worker.process.poll() is not None:  # killed by the poison job: restart it
            assert worker.process.returncode == -signal.SIGKILL
            restarts += 1
            worker = workers(*SHORT_LEASE, "--concurrency", "4", settings=RECOVERY)
        time.sleep(0.1)
    assert restarts >= 2
    job = Job.objects.get(pk=int(poison.id))
    assert job.status == JobStatus.DEAD_LETTER
    assert job.attempts == job.max_attempts == 3
    assert len([e for e in _events(observer, poison.id) if e["event"] == "start"]) == 3
    assert {e["exception_class"] for e in job.errors} == {"django_pgqueue.exceptions.LeaseExpired"}
    assert (
        Job.objects.filter(pk__in=[j.pk for j in normal], status=JobStatus.SUCCEEDED).count() == 50
    )


def test_a_stale_completion_after_a_lost_lease_is_rejected(workers, observer):
    result = tasks.ledger_sleep.enqueue(seconds=4, label="contested")
    stale = workers(
        "--lease-seconds", "1", "--poll-interval", "0.1", "--no-housekeeping", settings=RECOVERY
    )
    wait_for(lambda: _events(observer, result.id), timeout=30)
    stale.send(signal.SIGSTOP)  # frozen: no heartbeats, the lease runs out
    try:
        fresh = workers(*SHORT_LEASE, settings=RECOVERY)
        wait_for(
            lambda: Job.objects.get(pk=int(result.id)).status == JobStatus.SUCCEEDED, timeout=60
        )
    finally:
        stale.send(signal.SIGCONT)
    job = Job.objects.get(pk=int(result.id))
    assert job.result["pid"] == fresh.pid
    # The stale worker wakes up with its handler still running. Either its heartbeat
    # learns first that the lease is gone (the handler is told: cancelled) or the handler
    # returns first and its completion is fenced off; its result is never written.
    wait_for(
        lambda: (
            f"job {job.pk} lease lost" in stale.output()
            or f"job {job.pk}: lease lost" in stale.output()
        ),
        timeout=30,
        message="the stale worker to notice",
    )
    stale.send(signal.SIGTERM)
    assert stale.wait(30) == 0
    job.refresh_from_db()
    assert job.result["pid"] == fresh.pid
    assert job.status == JobStatus.SUCCEEDED
    events = _events(observer, job.pk)
    stale_events = [e["event"] for e in events if e["worker_pid"] == stale.pid]
    assert stale_events in (["start"], ["start", "end"], ["start", "cancelled", "end"])
