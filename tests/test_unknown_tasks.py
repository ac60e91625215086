"""Unknown tasks: a job whose task the worker cannot import waits, visibly, for one that can.

The waiting window (``UNKNOWN_TASK_TIMEOUT_SECONDS``) starts when the job became ready,
not when it was created: a job scheduled hours ahead that meets a worker without its task
(a rolling deploy) is not dead-lettered on its first claim. The worker says why it gives
the job back, once per job, in a WARNING an operator can act on.
"""

from __future__ import annotations

import os
import re
import sys
import uuid

import pytest

from django_pgqueue.models import Job
from django_pgqueue.states import JobStatus
from tests.workers import wait_for

pytestmark = pytest.mark.timeout(120)

MISSING = "tests.missing_module.vanished_task"
UNKNOWN_CLASS = "django_pgqueue.exceptions.UnknownTask"
FAST = ("--poll-interval", "0.2")


def _released(job_id: int, generation: int) -> Job | None:
    """Return the job once it is pending again at a lease generation past ``generation``."""
    job = Job.objects.get(pk=job_id)
    if job.status != JobStatus.PROCESSING and job.lease_generation > generation:
        return job
    return None


def test_a_job_created_long_ago_but_ready_only_now_is_not_dead_lettered_on_its_first_claim(
    workers, observer
):
    job_id = Job.objects.enqueue(MISSING).pk
    # Created an hour ago (scheduled far ahead, say) and ready only now: the window has
    # not started yet, whatever created_at says.
    observer.execute(
        "UPDATE django_pgqueue_job SET created_at = now() - interval '1 hour' WHERE id = %s",
        [job_id],
    )
    worker = workers(*FAST, settings={"UNKNOWN_TASK_TIMEOUT_SECONDS": 600})
    job = wait_for(lambda: _released(job_id, 0), timeout=30, message="the first claim\n")
    assert job.status == JobStatus.PENDING, (
        f"dead-lettered on its first claim: {job.last_error}\n{worker.output()}"
    )
    assert job.attempts == 0  # waiting for a worker that knows the task uses no attempt
    assert job.last_error_class == UNKNOWN_CLASS


def test_the_worker_warns_once_per_job_naming_the_task_the_error_and_the_fix(workers, observer):
    job_id = Job.objects.enqueue(MISSING).pk
    worker = workers(*FAST, settings={"UNKNOWN_TASK_TIMEOUT_SECONDS": 600})
    generation = 0
    for release in range(3):
        job = wait_for(
            lambda generation=generation: _released(job_id, generation),
            timeout=60,
            message=f"job {job_id} to be given back\n{worker.output()}",
        )
        assert job.status == JobStatus.PENDING, job.last_error
        generation = job.lease_generation
        if release < 2:
            # Do not wait out the backoff between claims. Not after the last release:
            # the worker would claim the job again before the checks below.
            Job.objects.run_now([job_id])
    output = worker.output()
    warnings = [line for line in output.splitlines() if "WARNING" in line and MISSING in line]
    assert len(warnings) == 1, f"expected one WARNING naming {MISSING}:\n{output}"
    (line,) = warnings
    assert "No module named 'tests.missing_module'" in line  # the import error
    assert re.search(r"deploy|restart", line, re.IGNORECASE), line  # what to do
    job = Job.objects.get(pk=job_id)
    assert job.status == JobStatus.PENDING
    assert job.last_error_class == UNKNOWN_CLASS


def test_a_second_worker_warns_about_the_same_job_once_too(workers, observer):
    job_id = Job.objects.enqueue(MISSING).pk
    first = workers(*FAST, settings={"UNKNOWN_TASK_TIMEOUT_SECONDS": 600})
    job = wait_for(lambda: _released(job_id, 0), timeout=30, message="the first worker's claim")
    first.send(15)
    assert first.wait(30) == 0
    Job.objects.run_now([job_id])
    second = workers(*FAST, settings={"UNKNOWN_TASK_TIMEOUT_SECONDS": 600})
    generation = job.lease_generation
    for _ in range(2):
        job = wait_for(
            lambda generation=generation: _released(job_id, generation),
            timeout=60,
            message=f"job {job_id} to be given back by the second worker\n{second.output()}",
        )
        generation = job.lease_generation
        Job.objects.run_now([job_id])
    for worker in (first, second):
        warnings = [
            line for line in worker.output().splitlines() if "WARNING" in line and MISSING in line
        ]
        assert len(warnings) == 1, worker.output()


def test_one_line_per_job_until_its_task_is_deployed_then_it_runs(
    workers, observer, tmp_path, monkeypatch
):
    # A module that does not exist yet, on the worker's path: "deploying" it writes it.
    module = f"late_module_{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), *sys.path]))
    job_id = Job.objects.enqueue(f"{module}.late_task").pk
    worker = workers(*FAST, settings={"UNKNOWN_TASK_TIMEOUT_SECONDS": 600})
    generation = 0
    for _ in range(3):
        job = wait_for(
            lambda generation=generation: _released(job_id, generation),
            timeout=60,
            message=f"job {job_id} to be given back\n{worker.output()}",
        )
        generation = job.lease_generation
        Job.objects.run_now([job_id])
    (tmp_path / f"{module}.py").write_text(
        "from django_pgqueue import task\n\n\n@task()\ndef late_task():\n    return 'deployed'\n"
    )
    wait_for(
        lambda: Job.objects.get(pk=job_id).status == JobStatus.SUCCEEDED,
        timeout=60,
        message=f"job {job_id} to run once its task exists\n{worker.output()}",
    )
    lines = [line for line in worker.output().splitlines() if f"job {job_id}" in line]
    # The warning once, however many times it was given back; the run that follows is
    # counted by the summary line (per-job lines are -v 2).
    assert len(lines) == 1, "\n".join(lines)
    assert "WARNING" in lines[0]
    assert "cannot import task" in lines[0]
    assert Job.objects.get(pk=job_id).attempts == 1  # the releases used no attempt


def test_max_jobs_counts_only_attempts_that_ran(workers, observer):
    # The unknown job is claimed first (higher priority) and given back: that ran nothing,
    # so --max-jobs 1 still runs the next job before it exits.
    unknown_id = Job.objects.enqueue(MISSING, priority=50).pk
    known_id = Job.objects.enqueue("tests.tasks.add", args=[2, 3]).pk
    worker = workers(*FAST, "--max-jobs", "1", settings={"UNKNOWN_TASK_TIMEOUT_SECONDS": 600})
    assert worker.wait(60) == 0, worker.output()
    assert Job.objects.get(pk=known_id).status == JobStatus.SUCCEEDED, worker.output()
    unknown = Job.objects.get(pk=unknown_id)
    assert unknown.status == JobStatus.PENDING
    assert unknown.lease_generation >= 1  # it was claimed, and given back unrun
    assert unknown.attempts == 0
    assert "stopped after 1 jobs" in worker.output()
