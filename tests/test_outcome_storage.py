"""Recording an outcome never crashes a worker, and one job's outcome never harms another's.

Text PostgreSQL refuses as it is (NUL, lone surrogates, a class path longer than its
column) is made storable; the poison job ends in a recorded terminal state, the jobs
recorded in the same batch succeed exactly once, the worker keeps serving. A job that
kills its worker process every time still reaches ``dead_letter`` within its attempts.
"""

from __future__ import annotations

import signal
import time

import pytest

from django_pgqueue.models import Job
from django_pgqueue.states import JobStatus
from django_pgqueue.store.values import JobSpec
from tests import ledger
from tests.tasks import POISON_OUTCOMES
from tests.workers import wait_for

pytestmark = pytest.mark.timeout(120)

RECOVERY = {"HOUSEKEEPING_INTERVAL_SECONDS": 0.2, "RETRY_BASE_SECONDS": 0.05, "RETRY_JITTER": 0}
TERMINAL = {JobStatus.SUCCEEDED, JobStatus.DEAD_LETTER}
NORMAL = 20


def _starts(observer, job_id: int) -> int:
    return sum(1 for entry in ledger.entries(observer, job_id) if entry["event"] == "start")


def _last_lines(worker, count: int = 4) -> str:
    return "\n".join(worker.output().splitlines()[-count:])


def _enqueue_batch(kind: str, *, max_attempts: int) -> tuple[int, list[int]]:
    """Enqueue normal jobs around one poison job, so they share claim and outcome batches."""
    specs = [JobSpec("tests.tasks.ledger_sleep", kwargs={"seconds": 0.05}) for _ in range(NORMAL)]
    poison = JobSpec(
        "tests.tasks.ledger_poison_outcome", kwargs={"kind": kind}, max_attempts=max_attempts
    )
    specs.insert(NORMAL // 2, poison)
    ids = [job.pk for job in Job.objects.enqueue_many(specs)]
    return ids.pop(NORMAL // 2), ids


def _settle(condition, *, timeout: float, describe) -> None:
    """Wait for ``condition``; on timeout fail with what ``describe()`` says then."""
    try:
        wait_for(condition, timeout=timeout)
    except AssertionError:
        raise AssertionError(f"timed out after {timeout}s: {describe()}") from None


@pytest.mark.parametrize("kind", POISON_OUTCOMES)
def test_an_unstorable_outcome_harms_neither_the_worker_nor_the_other_jobs(workers, observer, kind):
    poison, normal = _enqueue_batch(kind, max_attempts=1)
    worker = workers("--concurrency", "4", "--prefetch", "20", "--poll-interval", "0.2")

    def settled() -> bool:
        if worker.process.poll() is not None:
            return True  # crashed: nothing more will happen, fail below
        done = Job.objects.filter(pk__in=normal, status=JobStatus.SUCCEEDED).count()
        return done == NORMAL and Job.objects.get(pk=poison).status in TERMINAL

    _settle(settled, timeout=60, describe=lambda: f"a batch with a {kind} job to settle")
    assert worker.process.poll() is None, (
        f"the worker exited with {worker.process.returncode}: {_last_lines(worker)}"
    )
    job = Job.objects.get(pk=poison)
    if kind.endswith("_result"):
        # The handler returned: a success with its result made storable, or a failure
        # of this job alone saying why the result could not be stored.
        assert job.status in TERMINAL
        if job.status == JobStatus.DEAD_LETTER:
            assert job.last_error
    else:
        assert job.status == JobStatus.DEAD_LETTER, (job.status, job.last_error)
        assert job.last_error_class
        assert job.last_error_class.startswith(("builtins.ValueError", "tests.tasks.Overlong"))
        assert job.last_error  # the message, made storable
        assert len(job.errors) == 1
    assert _starts(observer, poison) == 1
    for job_id in normal:
        assert _starts(observer, job_id) == 1, f"job {job_id} ran more than once"
    # The worker still serves.
    extra = Job.objects.enqueue("tests.tasks.noop").pk
    wait_for(lambda: Job.objects.get(pk=extra).status == JobStatus.SUCCEEDED, timeout=30)


@pytest.mark.parametrize("kind", ["nul_message", "surrogate_result"])
def test_an_unstorable_outcome_under_a_supervisor_never_loops(workers, observer, kind):
    poison, normal = _enqueue_batch(kind, max_attempts=3)
    supervisor = workers(
        "--processes",
        "2",
        "--concurrency",
        "4",
        "--prefetch",
        "20",
        "--poll-interval",
        "0.2",
        settings=RECOVERY,
    )
    _settle(
        lambda: (
            Job.objects.get(pk=poison).status in TERMINAL
            and Job.objects.filter(pk__in=normal, status=JobStatus.SUCCEEDED).count() == NORMAL
        ),
        timeout=40,
        describe=lambda: (
            f"the {kind} job ran {_starts(observer, poison)} times, attempts "
            f"{Job.objects.get(pk=poison).attempts}, status {Job.objects.get(pk=poison).status}; "
            f"{supervisor.output().count('exited with')} children crashed"
        ),
    )
    assert _starts(observer, poison) <= 3
    assert "exited with" not in supervisor.output()
    for job_id in normal:
        assert _starts(observer, job_id) == 1, f"job {job_id} ran more than once"


@pytest.mark.parametrize(
    ("task", "exit_code"),
    [("tests.tasks.ledger_poison", -signal.SIGKILL), ("tests.tasks.ledger_exit_poison", 1)],
    ids=["sigkill", "os_exit"],
)
def test_a_job_that_kills_its_worker_every_time_is_dead_lettered_under_a_supervisor(
    workers, observer, task, exit_code
):
    poison = Job.objects.enqueue(task, max_attempts=3).pk
    supervisor = workers(
        "--processes", "2", "--lease-seconds", "1", "--poll-interval", "0.1", settings=RECOVERY
    )
    deadline = time.monotonic() + 90
    while Job.objects.get(pk=poison).status != JobStatus.DEAD_LETTER:
        assert time.monotonic() < deadline, (
            f"ran {_starts(observer, poison)} times, not dead-lettered: {_last_lines(supervisor)}"
        )
        assert _starts(observer, poison) <= 3, "ran more often than its max_attempts"
        time.sleep(0.1)
    job = Job.objects.get(pk=poison)
    assert job.attempts == job.max_attempts == 3
    assert _starts(observer, poison) == 3
    assert f"exited with {exit_code}" in supervisor.output()
