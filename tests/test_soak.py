"""Soak: two workers through 20,000 jobs while the test keeps killing them with SIGKILL."""

from __future__ import annotations

import random
import time

import pytest

from django_pgqueue.models import Job
from django_pgqueue.states import JobStatus
from django_pgqueue.store.values import JobSpec

pytestmark = [pytest.mark.soak, pytest.mark.timeout(900)]

JOBS = 20_000
RECOVERY = {"HOUSEKEEPING_INTERVAL_SECONDS": 0.2, "RETRY_BASE_SECONDS": 0.05, "RETRY_JITTER": 0}
# Each job sleeps this long, so the eight handler slots need at least
# JOBS * JOB_SECONDS / 8 = 12.5 s however fast the machine: the kill loop below
# (one kill per 0.2 to 0.8 s until 95% succeeded) cannot run out of work before
# it has killed many times. With a bare add, a quiet machine drained everything
# in 2 s and the test saw only two kills.
JOB_SECONDS = 0.005


def test_random_kill_9_loses_no_job(workers, observer):
    for start in range(0, JOBS, 5000):
        Job.objects.enqueue_many(
            [
                JobSpec(
                    "tests.tasks.add_slowly",
                    args=[index, index],
                    kwargs={"seconds": JOB_SECONDS},
                    max_attempts=20,
                )
                for index in range(start, start + 5000)
            ]
        )
    rng = random.Random(20_000)
    args = (
        "--lease-seconds",
        "1",
        "--poll-interval",
        "0.1",
        "--concurrency",
        "4",
        "--prefetch",
        "50",
    )
    running = [workers(*args, settings=RECOVERY) for _ in range(2)]
    kills = 0
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        succeeded = Job.objects.filter(status=JobStatus.SUCCEEDED).count()
        if succeeded == JOBS:
            break
        time.sleep(rng.uniform(0.2, 0.8))
        if succeeded < JOBS * 0.95:  # keep killing through most of the run
            victim = rng.randrange(len(running))
            running[victim].kill()
            kills += 1
            running[victim] = workers(*args, settings=RECOVERY)
    counts = dict(
        observer.execute(
            "SELECT status, count(*) FROM django_pgqueue_job_all GROUP BY 1"
        ).fetchall()
    )
    print(f"soak: {kills} workers killed with SIGKILL; final statuses {counts}")
    assert counts == {"succeeded": JOBS}
    wrong = observer.execute(
        "SELECT count(*) FROM django_pgqueue_job_all WHERE result <> to_jsonb((args->>0)::int * 2)"
    ).fetchone()[0]
    assert wrong == 0
    assert kills >= 10
    recovered = observer.execute(
        "SELECT count(*) FROM django_pgqueue_job_all WHERE attempts > 1"
    ).fetchone()[0]
    print(f"soak: {recovered} jobs needed more than one attempt")
