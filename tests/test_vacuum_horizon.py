"""What holds VACUUM back is named: the store's report, the lag page, the metrics and a
worker's warning when its claim from the head is slow.

A real session opens a REPEATABLE READ transaction, reads the job table and stays idle in
it, as a forgotten report or a paused debugger does; another session uses up a
transaction id. The report must name that session (pid, application name, state, query),
say how far behind it holds the horizon, and forget it once it ends.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable

import psycopg
import pytest
from django.test import override_settings

from django_pgqueue.admin import lag
from django_pgqueue.models import Job
from django_pgqueue.states import JobStatus
from django_pgqueue.store.reports import SnapshotHolder
from django_pgqueue.store.statements.admin import AdminStatements
from django_pgqueue.worker import Worker, WorkerOptions
from django_pgqueue.worker.horizon import MIN_HOLD_SECONDS, SlowClaimWarning
from django_pgqueue.worker.logfields import HORIZON_PID, WORKER
from tests.admin_fixtures import login, url

pytestmark = [pytest.mark.timeout(60), pytest.mark.django_db(transaction=True)]

LAG = url("django_pgqueue_lag")
TOKEN = "horizon-token-for-tests"


def _until(
    read: Callable[[], SnapshotHolder | None], done: Callable[[SnapshotHolder | None], bool]
):
    """Poll ``read`` until ``done`` holds (other sessions' statements come and go)."""
    deadline = time.monotonic() + 20
    while True:
        seen = read()
        if done(seen):
            return seen
        assert time.monotonic() < deadline, seen
        time.sleep(0.05)


@pytest.fixture
def holder(open_connection, observer):
    """A session idle in a REPEATABLE READ transaction that has read the job table, with
    a transaction id used up after its snapshot."""
    conn = open_connection(prepare=False)
    conn.execute("SET application_name = 'nightly-report'")
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    conn.execute("SELECT count(*) FROM django_pgqueue_job").fetchone()
    observer.execute("SELECT txid_current()")
    yield conn
    conn.execute("ROLLBACK")


def test_a_held_snapshot_is_named_until_it_ends(store, holder):
    pid = holder.info.backend_pid
    seen = _until(store.vacuum_horizon, lambda h: h is not None and h.pid == pid)
    assert seen is not None
    assert seen.kind == "session"
    assert seen.name == "nightly-report"
    assert seen.state == "idle in transaction"
    assert seen.xid_age >= 1
    assert seen.age_seconds is not None
    assert seen.age_seconds >= 0
    assert seen.query is not None
    assert "count(*) FROM django_pgqueue_job" in seen.query

    holder.execute("ROLLBACK")
    _until(store.vacuum_horizon, lambda h: h is None or h.pid != pid)


def test_the_report_leaves_its_own_session_out(store):
    runner_pid = store.runner.connection.info.backend_pid
    # Inside the store's own transaction its snapshot is the newest there is: reporting
    # it would name the reader, never a holder.
    with store.runner.connection.transaction():
        store.runner.connection.execute("SELECT txid_current()")
        seen = store.vacuum_horizon()
    assert seen is None or seen.pid != runner_pid


def test_the_lag_page_names_the_holder(client, holder, monkeypatch):
    login(client, superuser=True)
    pid = holder.info.backend_pid
    page = client.get(LAG)
    assert page.context["horizon"] is not None
    assert page.context["horizon"].pid == pid
    row = page.text.split('id="pgq-horizon"', 1)[1].split("</tr>", 1)[0]
    assert f"session {pid} (nightly-report), idle in transaction" in row
    assert "transactions behind" in row or "transaction behind" in row
    # Open for seconds, not minutes: shown, not flagged.
    assert "pgq-warn" not in row
    monkeypatch.setattr(lag, "HORIZON_WARN_SECONDS", 0)
    row = client.get(LAG).text.split('id="pgq-horizon"', 1)[1].split("</tr>", 1)[0]
    assert "pgq-warn" in row
    assert "VACUUM cannot remove the job table's dead tuples" in row

    holder.execute("ROLLBACK")
    _until(
        lambda: client.get(LAG).context["horizon"],
        lambda h: h is None or h.pid != pid,
    )


def _scrape(client) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    with override_settings(PGQUEUE_METRICS_TOKEN=TOKEN):
        response = client.get("/metrics/", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
        if sample.name.startswith("pgqueue_vacuum_horizon")
    }


def test_the_metrics_report_the_horizon(client, store, holder):
    pid = holder.info.backend_pid
    _until(store.vacuum_horizon, lambda h: h is not None and h.pid == pid)
    held = _scrape(client)
    assert held["pgqueue_vacuum_horizon_xid_age"] >= 1
    assert held["pgqueue_vacuum_horizon_age_seconds"] >= 0

    holder.execute("ROLLBACK")
    _until(store.vacuum_horizon, lambda h: h is None or h.pid != pid)
    # Nothing else of this database holds one for long: the gauges fall back (to zero, or
    # to another session's statement of a moment).
    after = _scrape(client)
    assert after["pgqueue_vacuum_horizon_xid_age"] < held["pgqueue_vacuum_horizon_xid_age"] + 1
    assert after["pgqueue_vacuum_horizon_age_seconds"] < 5


def test_a_slow_claim_warns_at_most_once_per_interval(store, holder, caplog):
    now = [1000.0]
    warning = SlowClaimWarning(every=300, clock=lambda: now[0], min_hold=0)
    assert not warning.due(0.2, None)  # floors off: claims are never "slow"
    assert not warning.due(0.01, 0.05)
    assert warning.due(0.2, 0.05)
    pid = holder.info.backend_pid
    seen = _until(store.vacuum_horizon, lambda h: h is not None and h.pid == pid)
    with caplog.at_level(logging.WARNING, logger="django_pgqueue.worker"):
        warning.warn("w-1", 0.2, seen)
    (record,) = caplog.records
    assert f"VACUUM is held back by session {pid} ('nightly-report'), idle in transaction" in (
        record.getMessage()
    )
    assert "count(*) FROM django_pgqueue_job" in record.getMessage()
    assert getattr(record, HORIZON_PID) == pid
    assert getattr(record, WORKER) == "w-1"
    now[0] += 299
    assert not warning.due(0.2, 0.05)
    now[0] += 1
    assert warning.due(0.2, 0.05)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="django_pgqueue.worker"):
        warning.warn("w-1", 0.2, None)
    assert "no transaction open for 0s or more" in caplog.records[0].getMessage()


def test_a_holder_of_a_moment_is_not_named(store, holder, caplog):
    # In a busy database the oldest snapshot is most of the time a statement of a few
    # milliseconds: a slow claim is not blamed on it.
    pid = holder.info.backend_pid
    seen = _until(store.vacuum_horizon, lambda h: h is not None and h.pid == pid)
    assert seen.age_seconds < MIN_HOLD_SECONDS
    with caplog.at_level(logging.WARNING, logger="django_pgqueue.worker"):
        SlowClaimWarning().warn("w-1", 0.2, seen)
    message = caplog.records[0].getMessage()
    assert f"no transaction open for {MIN_HOLD_SECONDS:g}s or more holds back VACUUM" in message
    assert str(pid) not in message
    assert getattr(caplog.records[0], HORIZON_PID) is None


def test_a_worker_names_the_holder_when_its_claim_is_slow(workers, holder, store):
    from tests import tasks

    pid = holder.info.backend_pid
    # Named only once it has been open MIN_HOLD_SECONDS.
    _until(
        store.vacuum_horizon,
        lambda h: h is not None and h.pid == pid and (h.age_seconds or 0) >= MIN_HOLD_SECONDS,
    )
    tasks.noop.enqueue()
    # Every claim from the head counts as slow: the warning comes with the first one.
    worker = workers("--max-jobs", "1", settings={"CLAIM_FLOOR_AFTER_SECONDS": 0.000001})
    assert worker.wait(60) == 0, worker.output()
    lines = [line for line in worker.output().splitlines() if "a claim from the head" in line]
    assert len(lines) == 1, worker.output()
    assert f"VACUUM is held back by session {pid} ('nightly-report')" in lines[0]


def test_a_horizon_that_cannot_be_read_does_not_hold_back_the_claimed_jobs(monkeypatch, caplog):
    # A server or pooler may refuse a system view the lookup reads: the jobs of the slow
    # claim still run, the warning still goes out (without a holder), and the error is
    # logged, not raised into the claim round.
    from tests import tasks

    def refuse(self):
        raise psycopg.errors.InsufficientPrivilege("permission denied for view pg_prepared_xacts")

    monkeypatch.setattr(AdminStatements, "vacuum_horizon", refuse)
    job_id = int(tasks.noop.enqueue().id)
    options = WorkerOptions.from_settings(
        handle_signals=False, concurrency=1, max_jobs=1, poll_interval=0.05
    )
    with (
        override_settings(PGQUEUE_CLAIM_FLOOR_AFTER_SECONDS=0.000001),
        caplog.at_level(logging.WARNING, logger="django_pgqueue.worker"),
    ):
        Worker(options).run()
    assert Job.objects.get(pk=job_id).status == JobStatus.SUCCEEDED
    refused = [r for r in caplog.records if "could not read what holds VACUUM" in r.getMessage()]
    assert len(refused) == 1
    assert refused[0].exc_info is not None
    assert "pg_prepared_xacts" in str(refused[0].exc_info[1])
    (slow,) = [r for r in caplog.records if "a claim from the head" in r.getMessage()]
    assert getattr(slow, HORIZON_PID) is None


# Only on the embedded server, which enables two-phase commit (PostgreSQL's default does
# not): CI's other legs deselect one_server tests.
@pytest.mark.one_server
def test_a_forgotten_prepared_transaction_is_named(store, open_connection, observer):
    (enabled,) = observer.execute("SHOW max_prepared_transactions").fetchone()
    assert int(enabled) > 0, "this test needs a server with max_prepared_transactions > 0"
    conn = open_connection(prepare=False)
    conn.execute("BEGIN")
    conn.execute("SELECT txid_current()")
    conn.execute("PREPARE TRANSACTION 'pgq-horizon-test'")
    try:
        observer.execute("SELECT txid_current()")
        seen = _until(
            store.vacuum_horizon,
            lambda h: h is not None and h.kind == "prepared transaction",
        )
        assert seen.name == "pgq-horizon-test"
        assert seen.pid is None
        assert seen.xid_age >= 1
        assert seen.age_seconds is not None
        assert seen.age_seconds >= 0
    finally:
        observer.execute("ROLLBACK PREPARED 'pgq-horizon-test'")
    _until(store.vacuum_horizon, lambda h: h is None or h.kind != "prepared transaction")


# A physical standby with hot_standby_feedback, streaming through a replication slot:
# its oldest snapshot becomes the slot's xmin on the primary, which VACUUM honours even
# while the standby is disconnected. Only on the suite's own embedded server (a standby
# is made from it with pg_basebackup); CI's other legs deselect one_server tests.
@pytest.mark.one_server
def test_a_standbys_replication_slot_is_named(store, observer):
    from tests.database import embedded_server

    server = embedded_server()
    slot = "pgq_horizon_test_standby"
    standby = server.root / "horizon-standby"
    shutil.rmtree(standby, ignore_errors=True)
    observer.execute("SELECT pg_create_physical_replication_slot(%s, true)", [slot])
    started = False
    try:
        server._run(
            [
                str(server.bindir / "pg_basebackup"),
                *("-D", str(standby), "-h", str(server.socket_dir), "-U", "postgres"),
                *("-S", slot, "-X", "stream", "-R", "--checkpoint=fast"),
            ]
        )
        # The primary keeps its socket in its data folder: the lock file came along.
        for lock in standby.glob(".s.PGSQL.*.lock"):
            lock.unlink()
        # After the primary's settings (copied in postgresql.conf): its own socket,
        # the same port number in another folder, and feedback every second.
        with (standby / "postgresql.auto.conf").open("a") as conf:
            conf.write(
                f"unix_socket_directories = '{standby}'\n"
                "hot_standby_feedback = on\nwal_receiver_status_interval = 1\n"
            )
        try:
            server._run(
                [
                    str(server.bindir / "pg_ctl"),
                    *("-D", str(standby), "-l", str(standby / "standby.log")),
                    *("-w", "-t", "60", "start"),
                ]
            )
        except Exception as error:
            log = standby / "standby.log"
            raise AssertionError(log.read_text() if log.exists() else "no standby log") from error
        started = True
        dbname = observer.info.dbname
        with psycopg.connect(host=str(standby), dbname=dbname, user="postgres") as reader:
            reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            reader.execute("SELECT count(*) FROM django_pgqueue_job").fetchone()
            for _ in range(3):
                observer.execute("SELECT txid_current()")  # transactions go by meanwhile
            seen = _until(
                store.vacuum_horizon,
                lambda h: h is not None and h.kind == "replication slot" and h.xid_age >= 3,
            )
            assert seen.name == slot
            assert seen.pid is not None  # its walsender, while the standby streams
            reader.execute("ROLLBACK")
    finally:
        if started:
            server._run(
                [str(server.bindir / "pg_ctl"), "-D", str(standby), "-m", "immediate", "stop"]
            )
        deadline = time.monotonic() + 20
        while True:  # its walsender may take a moment to let go of the slot
            try:
                observer.execute("SELECT pg_drop_replication_slot(%s)", [slot])
                break
            except psycopg.errors.ObjectInUse:
                assert time.monotonic() < deadline, "the slot stayed in use"
                time.sleep(0.1)
        shutil.rmtree(standby, ignore_errors=True)
    _until(store.vacuum_horizon, lambda h: h is None or h.kind != "replication slot")
