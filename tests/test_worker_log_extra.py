"""Every log record about a job carries its id, task, queue, attempt and worker in extra."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest

from django_pgqueue.models import Job
from django_pgqueue.states import JobStatus
from django_pgqueue.worker import Worker, WorkerOptions
from django_pgqueue.worker.logfields import (
    ATTEMPT,
    DURATION,
    JOB_ID,
    OUTCOME,
    QUEUE,
    TASK,
    WORKER,
)
from tests import ledger, tasks
from tests.workers import wait_for

pytestmark = pytest.mark.timeout(90)


class Records(logging.Handler):
    """Keep every record of the package's loggers."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.lock_ = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        with self.lock_:
            self.records.append(record)

    def about(self, job_id: int) -> list[logging.LogRecord]:
        with self.lock_:
            return [r for r in self.records if f"job {job_id}" in r.getMessage()]


@pytest.fixture
def records() -> Iterator[Records]:
    handler = Records()
    package = logging.getLogger("django_pgqueue")
    level = package.level
    package.addHandler(handler)
    package.setLevel(logging.DEBUG)
    yield handler
    package.removeHandler(handler)
    package.setLevel(level)


@pytest.fixture
def worker(db_url) -> Iterator[Worker]:
    options = WorkerOptions.from_settings(
        handle_signals=False, concurrency=4, lease_seconds=3, poll_interval=0.05
    )
    running = Worker(options)
    thread = threading.Thread(target=running.run)
    thread.start()
    yield running
    running.request_stop()
    thread.join(30)
    assert not thread.is_alive()
    # The ledger tasks ran in this process: their connection must not outlive the test.
    if ledger._connection is not None:
        ledger._connection.close()
        ledger._connection = None


def _assert_job_fields(record: logging.LogRecord, job_id: int, task: str, worker_id: str):
    message = record.getMessage()
    assert getattr(record, JOB_ID) == job_id, message
    assert getattr(record, TASK) == task, message
    assert getattr(record, QUEUE) == "default", message
    assert getattr(record, ATTEMPT) >= 1, message
    assert getattr(record, WORKER) == worker_id, message


def _status(job_id: int) -> str:
    return Job.objects.get(pk=job_id).status


def test_started_and_finished_lines(records, worker):
    ok = tasks.add.enqueue(1, 2)
    failing = tasks.always_fails.using(max_attempts=2).enqueue("nope")
    wait_for(lambda: _status(int(ok.id)) == JobStatus.SUCCEEDED, timeout=30)
    wait_for(lambda: _status(int(failing.id)) == JobStatus.DEAD_LETTER, timeout=30)
    wait_for(lambda: len(records.about(int(failing.id))) >= 4, timeout=10)

    about_ok = records.about(int(ok.id))
    assert [r.getMessage().split()[2].rstrip(":") for r in about_ok] == ["started", "succeeded"]
    for record in about_ok:
        _assert_job_fields(record, int(ok.id), "tests.tasks.add", worker.id)
    assert getattr(about_ok[1], OUTCOME) == "succeeded"
    assert getattr(about_ok[1], DURATION) >= 0

    about_failing = records.about(int(failing.id))
    for record in about_failing:
        _assert_job_fields(record, int(failing.id), "tests.tasks.always_fails", worker.id)
    outcomes = [getattr(r, OUTCOME, None) for r in about_failing]
    assert outcomes == [None, "failed, will retry", None, "dead-lettered"]
    assert [getattr(r, ATTEMPT) for r in about_failing] == [1, 1, 2, 2]
    assert about_failing[-1].levelno == logging.ERROR


def test_unknown_task_lease_lost_and_deadline_lines(records, worker, observer):
    unknown = Job.objects.enqueue("tests.tasks.no_such_task")
    overrun = tasks.ledger_overrun.enqueue(seconds=30)
    sleeper = tasks.ledger_sleep.enqueue(seconds=30)
    # Another worker took the sleeper over: its lease generation moved on.
    wait_for(lambda: _status(int(sleeper.id)) == JobStatus.PROCESSING, timeout=30)
    observer.execute(
        "UPDATE django_pgqueue_job SET lease_generation = lease_generation + 1 WHERE id = %s",
        [int(sleeper.id)],
    )

    def line(job_id: int, text: str) -> logging.LogRecord | None:
        return next((r for r in records.about(job_id) if text in r.getMessage()), None)

    cannot_import = wait_for(
        lambda: line(unknown.pk, "cannot import task"), timeout=30, message="unknown task"
    )
    _assert_job_fields(cannot_import, unknown.pk, "tests.tasks.no_such_task", worker.id)
    past_timeout = wait_for(
        lambda: line(int(overrun.id), "ran past its timeout"), timeout=30, message="deadline"
    )
    _assert_job_fields(past_timeout, int(overrun.id), "tests.tasks.ledger_overrun", worker.id)
    lost = wait_for(
        lambda: line(int(sleeper.id), "lease lost"), timeout=30, message="lease lost line"
    )
    _assert_job_fields(lost, int(sleeper.id), "tests.tasks.ledger_sleep", worker.id)
    abandoned = wait_for(
        lambda: line(int(sleeper.id), "abandoned"), timeout=30, message="abandoned line"
    )
    assert getattr(abandoned, OUTCOME) == "abandoned"
