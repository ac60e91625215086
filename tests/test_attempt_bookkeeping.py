"""Bookkeeping per attempt: a stale attempt finishing never touches the live attempt's state.

A worker can re-claim a job whose earlier attempt still runs in its own process: the
process was paused past its lease and the lease was reaped meanwhile, or a sync handler
outlived its timeout. When the old handler returns, the new attempt must keep its lease
extended and its timeout enforced; otherwise it expires mid-run, runs again, and the same
happens on every following attempt.
"""

from __future__ import annotations

import signal
import time

import pytest

from django_pgqueue.models import Job
from django_pgqueue.states import JobStatus
from tests import ledger, tasks
from tests.workers import wait_for

pytestmark = pytest.mark.timeout(150)

RECOVERY = {"HOUSEKEEPING_INTERVAL_SECONDS": 0.2, "RETRY_BASE_SECONDS": 0.05, "RETRY_JITTER": 0}
TERMINAL = {JobStatus.SUCCEEDED, JobStatus.DEAD_LETTER, JobStatus.CANCELLED}


def _starts(observer, job_id: int) -> list[dict]:
    return [e for e in ledger.entries(observer, job_id) if e["event"] == "start"]


def _wait_settled(observer, job_id: int, *, most_starts: int, timeout: float) -> Job:
    """Wait until the job is terminal; fail early once it has run more than ``most_starts``."""
    deadline = time.monotonic() + timeout
    while True:
        job = Job.objects.get(pk=job_id)
        starts = _starts(observer, job_id)
        assert len(starts) <= most_starts, (
            f"job {job_id} started {len(starts)} times (attempts "
            f"{[e['attempt'] for e in starts]}), status {job.status}; errors: "
            f"{[e['exception_class'].rsplit('.', 1)[-1] for e in job.errors]}"
        )
        if job.status in TERMINAL:
            return job
        assert time.monotonic() < deadline, f"job {job_id} is still {job.status}"
        time.sleep(0.05)


def test_a_job_re_claimed_while_its_paused_attempt_still_runs_succeeds_on_that_attempt(
    workers, observer
):
    # Attempt 1 sleeps through its cancellation for 4 s; later attempts take 5 s, longer
    # than the 2 s lease, so they depend on the heartbeat extending it.
    result = tasks.ledger_sleep_through.enqueue(seconds=4, later_seconds=5)
    job_id = int(result.id)
    worker = workers("--lease-seconds", "2", "--poll-interval", "0.1", settings=RECOVERY)
    wait_for(lambda: _starts(observer, job_id), timeout=30, message="the first attempt")
    worker.send(signal.SIGSTOP)
    try:
        # Frozen past its lease: another process recovers the job meanwhile.
        wait_for(
            lambda: observer.execute(
                "SELECT lease_expires_at < now() FROM django_pgqueue_job_all WHERE id = %s",
                [job_id],
            ).fetchone()[0],
            timeout=10,
            message="the frozen worker's lease to expire",
        )
        (reaped,) = Job.objects.reap_expired()
        assert reaped.status == JobStatus.PENDING
    finally:
        worker.send(signal.SIGCONT)
    # The worker resumes with attempt 1 still running and claims attempt 2 itself.
    job = _wait_settled(observer, job_id, most_starts=2, timeout=60)
    assert job.status == JobStatus.SUCCEEDED, (job.status, job.last_error)
    assert job.attempts == 2
    assert job.result == 2
    assert [e["exception_class"] for e in job.errors] == [
        "django_pgqueue.exceptions.LeaseExpired"
    ], "a later attempt expired mid-run"
    assert [e["attempt"] for e in _starts(observer, job_id)] == [1, 2]
    assert "lease lost (generation 2)" not in worker.output()


def test_a_job_re_claimed_while_its_timed_out_attempt_still_runs_succeeds_on_that_attempt(
    workers, observer
):
    # Attempt 1 overruns its 4 s timeout and returns at 4.6 s; attempt 2 (3.2 s, in
    # time, longer than the 1.5 s lease) is still running when attempt 1 returns and
    # runs on for longer than a lease after that.
    result = tasks.ledger_overrun_once.enqueue()
    job_id = int(result.id)
    worker = workers("--lease-seconds", "1.5", "--poll-interval", "0.1", settings=RECOVERY)
    job = _wait_settled(observer, job_id, most_starts=2, timeout=60)
    assert job.status == JobStatus.SUCCEEDED, (job.status, job.last_error, worker.output()[-2000:])
    assert job.attempts == 2
    assert job.result == 2
    assert [e["exception_class"] for e in job.errors] == ["django_pgqueue.exceptions.JobTimeout"]
