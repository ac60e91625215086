"""A session holding the schedule sync lock cannot keep a starting worker from its jobs.

Every worker syncs the declared schedules before it takes jobs, under one advisory lock
so that workers starting together sync in turn. A session that takes that lock and never
commits (a stuck deploy script, a debugging shell) used to hold every starting worker at
that point for as long as it lived. The wait is now bounded; the scheduler thread syncs
once the lock is free.
"""

from __future__ import annotations

import logging
import threading

import pytest

from django_pgqueue.features.scheduling import sync_schedules
from django_pgqueue.models import Job
from django_pgqueue.states import JobStatus
from django_pgqueue.store.queue import SCHEDULE_SYNC_LOCK_KEY
from django_pgqueue.store.statements.base import timeout_setting
from django_pgqueue.store.values import JobSpec
from django_pgqueue.worker import Worker, WorkerOptions
from django_pgqueue.worker import scheduler as scheduler_module
from django_pgqueue.worker.connection import CONNECTION_ERRORS, ConnectionSlot
from django_pgqueue.worker.scheduler import Scheduler
from tests.workers import wait_for

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def short_sync_wait(monkeypatch):
    monkeypatch.setattr(scheduler_module, "SYNC_LOCK_TIMEOUT", 0.5)


def _hold_sync_lock(conn) -> None:
    conn.execute("BEGIN")
    conn.execute("SELECT pg_advisory_xact_lock(%s)", [SCHEDULE_SYNC_LOCK_KEY])


def test_a_worker_runs_its_jobs_while_another_session_holds_the_sync_lock(
    db_url, open_connection, short_sync_wait, caplog
):
    holder = open_connection()
    _hold_sync_lock(holder)
    try:
        job = Job.objects.enqueue_many([JobSpec("tests.tasks.add", args=[2, 3])])[0]
        worker = Worker(
            WorkerOptions.from_settings(queues=("default",), burst=True, handle_signals=False)
        )
        with caplog.at_level(logging.WARNING, logger="django_pgqueue.schedules"):
            thread = threading.Thread(target=worker.run)
            thread.start()
            thread.join(30)
        assert not thread.is_alive(), "the worker is stuck behind the sync lock"
    finally:
        holder.execute("ROLLBACK")
    row = Job.objects.get(pk=job.pk)
    assert (row.status, row.result) == (JobStatus.SUCCEEDED, 5)
    assert "could not sync the schedules yet" in caplog.text
    assert "lock timeout" in caplog.text


def test_the_scheduler_syncs_once_the_lock_is_free(db_url, open_connection, short_sync_wait):
    holder = open_connection()
    _hold_sync_lock(holder)
    scheduler = Scheduler(alias="default", name="pgqueue test scheduler")
    try:
        scheduler.start()  # returns once the bounded wait gave up
        assert scheduler._synced is False
        holder.execute("COMMIT")
        wait_for(lambda: scheduler._synced, timeout=20, message="the retried sync")
    finally:
        scheduler.stop()
        scheduler.join(10)
        if holder.info.transaction_status:
            holder.execute("ROLLBACK")
    assert not scheduler.is_alive()


def test_a_worker_paused_inside_its_sync_lets_go_of_the_lock(open_connection, short_sync_wait):
    # The starting worker syncs and then stops before its COMMIT (SIGSTOP, a frozen VM):
    # its connection stays open, but the server ends the session once it has sat idle
    # for the bounded wait, so the sync lock is free again for the others, and the
    # paused worker meets a lost connection when it resumes (the scheduler then retries).
    slot = ConnectionSlot("default", "pgqueue paused starter")
    other = open_connection()

    def sync_lock_free() -> bool:
        # A transaction-level lock of its own statement: let go of at once.
        return other.execute(
            "SELECT pg_try_advisory_xact_lock(%s)", [SCHEDULE_SYNC_LOCK_KEY]
        ).fetchone()[0]

    try:
        with pytest.raises(CONNECTION_ERRORS), slot.connection.transaction():
            sync_schedules(slot.store, [], lock_timeout=scheduler_module.SYNC_LOCK_TIMEOUT)
            assert not sync_lock_free()
            # The pause: this thread sends nothing more until the lock is free.
            wait_for(sync_lock_free, timeout=20, message="the server to end the paused sync")
    finally:
        slot.close()


@pytest.mark.parametrize(
    ("seconds", "setting"),
    [(None, "0"), (5.0, "5000ms"), (0.25, "250ms"), (0.0001, "1ms")],
)
def test_a_timeout_is_sent_in_milliseconds_and_a_positive_one_never_as_zero(seconds, setting):
    # '0' turns the server's timeout off: a tiny positive bound must stay a bound.
    assert timeout_setting(seconds) == setting
