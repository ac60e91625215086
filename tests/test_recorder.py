"""The recorder thread: outcomes are written on a connection of their own.

A completion that waits (on a row lock, a slow server) must not stop the dispatcher from
claiming and starting other jobs, and an error in the recorder that is not the
database's must stop the worker as one in the dispatcher does, not leave it claiming
jobs whose outcomes nobody writes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from django_pgqueue.models import Job
from django_pgqueue.store.queue import QueueStore
from django_pgqueue.store.values import JobSpec
from django_pgqueue.worker import Worker, WorkerOptions
from django_pgqueue.worker.exitwatch import WRITE_ALLOWANCE_SECONDS, OverdueWriteWatchdog

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def in_process_ledger() -> Any:
    """Close the ledger connection the in-process handlers opened."""
    from tests import ledger

    yield ledger
    if ledger._connection is not None:
        ledger._connection.close()
        ledger._connection = None


def _poll(what: str, check: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.02)
    pytest.fail(f"timed out waiting until {what}")


def _options(**changes: Any) -> WorkerOptions:
    return WorkerOptions.from_settings(
        handle_signals=False, housekeeping=False, schedules=False, **changes
    )


def test_a_completion_waiting_on_a_lock_does_not_hold_up_the_next_claim(
    db_url,
    observer: psycopg.Connection[Any],
    open_connection: Callable[..., psycopg.Connection[Any]],
    in_process_ledger: Any,
):
    first = Job.objects.enqueue("tests.tasks.ledger_sleep", kwargs={"seconds": 1.0})
    worker = Worker(_options(concurrency=2, prefetch_window=0))
    thread = threading.Thread(target=worker.run)
    thread.start()
    blocker = open_connection(prepare=False)
    try:
        _poll(
            "the first job starts",
            lambda: observer.execute(
                "SELECT 1 FROM tests_ledgerentry WHERE job_id = %s AND event = 'start'",
                [first.id],
            ).fetchone(),
        )
        # While its handler sleeps, another session locks the job's row: its completion
        # will wait for that lock.
        blocker.execute("BEGIN")
        blocker.execute("SELECT 1 FROM django_pgqueue_job WHERE id = %s FOR UPDATE", [first.id])
        _poll(
            "the completion waits on the locked row",
            lambda: observer.execute(
                "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() "
                "AND application_name LIKE %s AND wait_event_type = 'Lock'",
                [f"pgqueue % {worker.id}"[:63]],
            ).fetchone(),
        )
        second = Job.objects.enqueue("tests.tasks.ledger_sleep", kwargs={"label": "b"})
        _poll(
            "the second job runs while the first one's completion waits",
            lambda: observer.execute(
                "SELECT 1 FROM tests_ledgerentry WHERE job_id = %s AND event = 'end'",
                [second.id],
            ).fetchone(),
        )
        assert observer.execute(
            "SELECT status FROM django_pgqueue_job_all WHERE id = %s", [first.id]
        ).fetchone() == ("processing",)
        blocker.execute("ROLLBACK")
        _poll(
            "both jobs are recorded once the lock is gone",
            lambda: observer.execute(
                "SELECT count(*) = 2 FROM django_pgqueue_job_all "
                "WHERE id = ANY(%s) AND status = 'succeeded'",
                [[first.id, second.id]],
            ).fetchone()[0],
        )
    finally:
        if blocker.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            blocker.execute("ROLLBACK")
        worker.request_stop()
        thread.join(30)
    assert not thread.is_alive()
    assert worker.processed == 2


class _RecorderBug(Exception):
    pass


def test_a_completion_whose_acknowledgement_was_lost_is_recorded_as_a_success(
    db_url,
    observer: psycopg.Connection[Any],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
):
    """The batch committed, then the connection dropped before the answer arrived: the
    recorder sends it again, and its jobs are successes (counted, logged), not lost."""
    real = QueueStore.complete_many_outcomes
    sent: list[set[int]] = []

    def committed_then_cut(self: QueueStore, worker_id: str, completions: Any) -> Any:
        done = real(self, worker_id, completions)  # autocommit: it is committed
        sent.append(set(done))
        if len(sent) == 1:
            self.runner.connection.close()
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return done

    monkeypatch.setattr(QueueStore, "complete_many_outcomes", committed_then_cut)
    caplog.set_level(logging.DEBUG, logger="django_pgqueue.jobs")
    jobs = Job.objects.enqueue_many([JobSpec("tests.tasks.add", args=[n, 1]) for n in range(3)])
    ids = {job.id for job in jobs}
    worker = Worker(_options(concurrency=1, prefetch=5, prefetch_window=0))
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        _poll("every job is finished", lambda: worker.processed == 3)
    finally:
        worker.request_stop()
        thread.join(30)
    assert not thread.is_alive()
    rows = observer.execute(
        "SELECT id, status, result::text "
        "FROM django_pgqueue_job_all WHERE id = ANY(%s) ORDER BY id",
        [sorted(ids)],
    ).fetchall()
    assert [(status, result) for _, status, result in rows] == [
        ("succeeded", str(n + 1)) for n in range(3)
    ]
    # The cut batch was sent again, and its jobs came back done.
    assert len(sent) >= 2
    assert sent[0] <= sent[1]
    finished = [
        record.args[:2]
        for record in caplog.records
        if record.name == "django_pgqueue.jobs" and record.msg.startswith("job %s %s:")
    ]
    assert sorted(finished) == [(job_id, "succeeded") for job_id in sorted(ids)]


def test_an_error_in_the_recorder_stops_the_worker_like_one_in_the_dispatcher(
    db_url, observer: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
):
    def broken(self: Worker, store: Any, outcomes: list[Any]) -> None:
        raise _RecorderBug("a bug while writing outcomes")

    monkeypatch.setattr(Worker, "_write_outcomes", broken)
    jobs = Job.objects.enqueue_many([JobSpec("tests.tasks.add", args=[n, 1]) for n in range(3)])
    worker = Worker(_options(concurrency=1))
    raised: list[BaseException] = []

    def run() -> None:
        try:
            worker.run()
        except BaseException as error:
            raised.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "the worker kept running without a recorder"
    assert len(raised) == 1
    assert isinstance(raised[0], _RecorderBug)
    # Nothing was recorded: the jobs it ran are left to their leases (attempt counted),
    # not released to run again at once.
    statuses = observer.execute(
        "SELECT DISTINCT status FROM django_pgqueue_job_all WHERE id = ANY(%s)",
        [[job.id for job in jobs]],
    ).fetchall()
    assert ("succeeded",) not in statuses


def test_a_completion_stuck_on_a_row_lock_does_not_hold_the_shutdown_past_its_grace(
    db_url,
    observer: psycopg.Connection[Any],
    open_connection: Callable[..., psycopg.Connection[Any]],
    in_process_ledger: Any,
    caplog: pytest.LogCaptureFixture,
):
    # Another session holds the finished job's row for longer than the grace period (an
    # operator's open transaction): the stopping worker cancels its stuck write, hands
    # back the job still running and exits, instead of waiting for the lock.
    finished = Job.objects.enqueue("tests.tasks.ledger_sleep", kwargs={"seconds": 0.5})
    running = Job.objects.enqueue("tests.tasks.ledger_sleep", kwargs={"seconds": 60.0})
    worker = Worker(_options(concurrency=2, prefetch_window=0, grace_seconds=1.0))
    thread = threading.Thread(target=worker.run)
    blocker = open_connection(prepare=False)
    try:
        thread.start()
        _poll(
            "both jobs start",
            lambda: observer.execute(
                "SELECT count(*) = 2 FROM tests_ledgerentry "
                "WHERE job_id = ANY(%s) AND event = 'start'",
                [[finished.id, running.id]],
            ).fetchone()[0],
        )
        blocker.execute("BEGIN")
        blocker.execute("SELECT 1 FROM django_pgqueue_job WHERE id = %s FOR UPDATE", [finished.id])
        _poll(
            "the finished job's completion waits on the locked row",
            lambda: observer.execute(
                "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() "
                "AND application_name LIKE %s AND wait_event_type = 'Lock'",
                [f"pgqueue recorder {worker.id}"[:63]],
            ).fetchone(),
        )
        worker.request_stop()
        thread.join(30)
        assert not thread.is_alive(), "the shutdown waited on the locked row past its grace"
        # Still locked by the blocker: the write was cancelled, not finished.
        assert blocker.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
    finally:
        if blocker.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            blocker.execute("ROLLBACK")
        if thread.is_alive():
            worker.request_stop()
            thread.join(30)
    rows = dict(
        observer.execute(
            "SELECT id, status FROM django_pgqueue_job_all WHERE id = ANY(%s)",
            [[finished.id, running.id]],
        ).fetchall()
    )
    # Nothing recorded for the finished job: it keeps its lease (attempt counted) and
    # comes back when the lease expires. The running one was released, attempt refunded.
    assert rows == {finished.id: "processing", running.id: "pending"}
    assert observer.execute(
        "SELECT attempts FROM django_pgqueue_job_all WHERE id = %s", [running.id]
    ).fetchone() == (0,)
    assert "cancelled it" in caplog.text
    assert not observer.execute(
        "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() "
        "AND application_name LIKE %s",
        [f"pgqueue % {worker.id}"[:63]],
    ).fetchone(), "a connection of the stopped worker is still open"


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("now", "started", "stop_now", "overdue"),
    [
        (100.0, None, False, False),  # no write under way
        (100.0, 90.0, False, False),  # inside the grace period
        (110.0, 109.0, False, False),  # grace over, but the write just began
        (110.0, 108.0, False, True),  # grace over and the write had its allowance
        (105.0, 102.0, True, True),  # a second signal ended the grace period
        (105.0, 104.0, True, False),  # ... still, a write gets its allowance
    ],
)
def test_the_exit_watchdog_cancels_only_a_write_past_grace_and_allowance(
    now: float, started: float | None, stop_now: bool, overdue: bool
):
    clock = _Clock()
    clock.now = now
    watchdog = OverdueWriteWatchdog(
        grace_ends=108.0,
        write_started=lambda: started,
        cancel=lambda: True,
        stop_now=lambda: stop_now,
        clock=clock,
    )
    assert watchdog.overdue() is overdue
    assert WRITE_ALLOWANCE_SECONDS == 2.0


def test_the_exit_watchdog_keeps_cancelling_until_the_write_ends():
    # A cancel that lands between two statements cancels nothing: the watchdog tries
    # again while a write is overdue, and stops once none runs.
    writes = threading.Event()
    calls: list[int] = []

    def cancel() -> bool:
        calls.append(1)
        if len(calls) >= 3:
            writes.set()
        return len(calls) >= 3

    with OverdueWriteWatchdog(
        grace_ends=0.0,
        write_started=lambda: None if writes.is_set() else 0.0,
        cancel=cancel,
        stop_now=lambda: False,
    ) as watchdog:
        assert writes.wait(10), "the watchdog stopped trying"
    assert len(calls) == 3
    assert watchdog.cancelled == 1
