"""Failures are recorded as they happened: the real class, the real message, real times.

Real ``runqueueworker`` subprocesses run the tasks. The test app's signal receiver writes
``task_started``/``task_finished`` of tasks named ``signal_*`` to the ledger.
"""

from __future__ import annotations

import datetime as dt

import pytest

from django_pgqueue.compat import TaskResultStatus, task_backends
from django_pgqueue.models import Job
from django_pgqueue.states import JobStatus
from tests import ledger, tasks

pytestmark = pytest.mark.timeout(120)

# A retry far enough away that a burst worker ends before it is due.
SLOW_RETRY = {"RETRY_BASE_SECONDS": 600, "RETRY_MAX_SECONDS": 600}


def _job(result):
    return Job.objects.get(pk=int(result.id))


@pytest.mark.parametrize(
    ("kind", "error_class", "message"),
    [
        ("system_exit", "builtins.SystemExit", "3"),
        ("keyboard_interrupt", "builtins.KeyboardInterrupt", "stop"),
        ("exit", "builtins.SystemExit", "bye"),
        ("async", "builtins.SystemExit", "4"),
    ],
)
def test_system_exit_and_keyboard_interrupt_are_task_failures(
    workers, observer, kind, error_class, message
):
    if kind == "async":
        result = tasks.signal_async_exit.enqueue()
    else:
        result = tasks.signal_exit.enqueue(kind)
    worker = workers("--burst", settings=SLOW_RETRY)
    assert worker.wait() == 0, worker.output()
    job = _job(result)
    assert (job.status, job.attempts) == (JobStatus.PENDING, 1)  # retried like any failure
    assert (job.last_error_class, job.last_error) == (error_class, message)
    events = [(e["event"], e["label"]) for e in ledger.entries(observer, job.pk)]
    assert events == [
        ("signal:started", str(TaskResultStatus.RUNNING)),
        ("signal:finished", str(TaskResultStatus.FAILED)),
    ]
    output = worker.output()
    assert "runner itself failed" not in output, output
    assert f"job {result.id} failed, will retry" in output


def test_an_exception_whose_str_raises_is_recorded_with_its_own_class(workers):
    result = tasks.raises_unprintable.enqueue()
    worker = workers("--burst")
    assert worker.wait() == 0, worker.output()
    job = _job(result)
    assert job.last_error_class == "tests.tasks.UnprintableError"
    assert job.last_error == "<str() of the exception failed: RuntimeError>"
    assert "tests.tasks.UnprintableError" in job.errors[0]["traceback"]
    assert "runner itself failed" not in worker.output()
    failed = task_backends["default"].get_result(result.id)
    assert [error.exception_class for error in failed.errors] == [tasks.UnprintableError]


def test_an_async_tasks_own_timeout_error_is_reported_as_itself(workers):
    result = tasks.async_own_timeout.enqueue()
    assert workers("--burst").wait() == 0
    job = _job(result)
    assert job.status == JobStatus.DEAD_LETTER
    assert (job.last_error_class, job.last_error) == (
        "builtins.TimeoutError",
        "the upstream API timed out",
    )


def test_only_our_timeout_is_a_job_timeout(workers):
    result = tasks.async_overrun.enqueue(30)
    assert workers("--burst").wait() == 0
    assert _job(result).last_error_class == "django_pgqueue.exceptions.JobTimeout"


@pytest.mark.parametrize(
    ("task_path", "message"),
    [
        ("tests.tasks.add", "add() got an unexpected keyword argument 'c'"),
        ("tests.tasks.async_add", "async_add() got an unexpected keyword argument 'c'"),
    ],
)
def test_arguments_that_do_not_bind_are_recorded_as_the_real_type_error(
    workers, task_path, message
):
    job = Job.objects.enqueue(task_path, args=[1], kwargs={"c": 3}, max_attempts=5)
    assert workers("--burst").wait() == 0
    job.refresh_from_db()
    # Permanent (one attempt, dead-lettered), yet recorded as what Python raised.
    assert (job.status, job.attempts) == (JobStatus.DEAD_LETTER, 1)
    assert (job.last_error_class, job.last_error) == ("builtins.TypeError", message)
    assert f"arguments do not match {task_path}(a:" in job.errors[0]["traceback"]


def test_a_type_error_inside_the_task_stays_retryable(workers):
    job = Job.objects.enqueue("tests.tasks.add", args=[1, "x"], max_attempts=2)
    assert workers("--burst", settings=SLOW_RETRY).wait() == 0
    job.refresh_from_db()
    assert job.last_error_class == "builtins.TypeError"
    assert (job.attempts, job.status) == (1, JobStatus.PENDING)


def test_finished_at_is_when_an_atomic_handler_finished(workers):
    result = tasks.atomic_finish_clock.enqueue()
    worker = workers("--burst")
    assert worker.wait() == 0, worker.output()
    job = _job(result)
    assert job.status == JobStatus.SUCCEEDED
    handler_end = dt.datetime.fromisoformat(job.result)
    assert job.finished_at >= handler_end
    assert task_backends["default"].get_result(result.id).finished_at >= handler_end
