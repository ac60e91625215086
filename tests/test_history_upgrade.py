"""The upgrade to two tiers on a live queue: a rolling deploy from the previous release.

The test database goes back to migration 0018 and is given a job table as the previous
release leaves it (finished rows and a backlog). A worker running the previous
release's code (``git archive`` of the commit before migration 0019) drains the
backlog while ``migrate`` runs; a worker of this release joins, producers keep
enqueueing, the old worker leaves. Meanwhile a probe times a claim-like write and an
enqueue on the job table every few milliseconds: the longest of them is the longest
the upgrade held the queue. At the end every job ran exactly once (the ledger), every
finished job is in the history and none in the job table, and none is in both.
"""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connections

from tests.ledger import entries
from tests.releases import assert_logged_no_error, checkout, previous_release
from tests.workers import WorkerProcess, wait_for

pytestmark = [pytest.mark.timeout(900), pytest.mark.soak]

OLD_FINISHED = 200_000
BACKLOG = 10_000
LATER = 2_000
#: A write to the job table that took longer than this while the migrations ran would
#: mean the upgrade held the queue beyond one short statement.
LONGEST_WAIT_ALLOWED = 5.0


class Probe(threading.Thread):
    """Times a claim-like write and an enqueue on the job table, again and again."""

    def __init__(self, conn, sentinel: int) -> None:
        super().__init__(daemon=True)
        self.conn = conn
        self.sentinel = sentinel
        self.stop = threading.Event()
        self.longest = 0.0
        self.samples = 0

    def run(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            self.conn.execute(
                "UPDATE django_pgqueue_job SET priority = priority WHERE id = %s", [self.sentinel]
            )
            self.conn.execute(
                "INSERT INTO django_pgqueue_job (queue, task_path, args, kwargs, priority, "
                "status, attempts, max_attempts, lease_generation, errors) "
                "VALUES ('probe', 'tests.tasks.noop', '[]', '{}', 0, 'pending', 0, 1, 0, '[]')"
            )
            self.longest = max(self.longest, time.monotonic() - started)
            self.samples += 1
            time.sleep(0.005)


def _enqueue(conn, count: int, label: str) -> None:
    conn.execute(
        "INSERT INTO django_pgqueue_job (queue, task_path, args, kwargs, priority, status, "
        "attempts, max_attempts, lease_generation, errors) "
        "SELECT 'default', 'tests.tasks.ledger_sleep', '[]', "
        "jsonb_build_object('label', %s::text || g), 0, 'pending', 0, 5, 0, '[]' "
        "FROM generate_series(1, %s) AS g",
        [label, count],
    )
    conn.execute("NOTIFY django_pgqueue, 'default'")


def test_a_rolling_deploy_moves_the_history_without_losing_or_repeating_a_job(
    db_url, open_connection, capsys
):
    conn = open_connection()
    call_command("migrate", "django_pgqueue", "0018", verbosity=0)
    try:
        conn.execute(
            "INSERT INTO django_pgqueue_job (queue, task_path, args, kwargs, priority, status, "
            "attempts, max_attempts, lease_generation, errors, created_at, started_at, "
            "finished_at, result, idempotency_key) "
            "SELECT 'default', 'tests.tasks.noop', '[]', '{}', 0, 'succeeded', 1, 5, 1, '[]', "
            "t, t, t, 'null', CASE WHEN g %% 100 = 0 THEN 'old-' || g END "
            "FROM (SELECT g, now() - make_interval(secs => g / 100.0) AS t "
            "FROM generate_series(1, %s) AS g) AS s",
            [OLD_FINISHED],
        )
        (sentinel,) = conn.execute(
            "INSERT INTO django_pgqueue_job (queue, task_path, args, kwargs, priority, status, "
            "attempts, max_attempts, lease_generation, errors) VALUES ('probe', "
            "'tests.tasks.noop', '[]', '{}', 0, 'pending', 0, 1, 0, '[]') RETURNING id"
        ).fetchone()
        _enqueue(conn, BACKLOG, "before-")
        conn.execute("VACUUM ANALYZE django_pgqueue_job")
        with tempfile.TemporaryDirectory(prefix="pgqueue-previous-") as old_tree:
            checkout(previous_release("0019_history"), Path(old_tree))
            old = WorkerProcess(
                db_url, "--queue", "default", "--concurrency", "4", cwd=Path(old_tree)
            )
            new = None
            try:
                wait_for(
                    lambda: (
                        conn.execute(
                            "SELECT count(*) FROM tests_ledgerentry WHERE event = 'end'"
                        ).fetchone()[0]
                        > 200
                    ),
                    timeout=120,
                    message=f"the old worker to run jobs\n{old.output()}",
                )
                probe = Probe(open_connection(), sentinel)
                probe.start()
                started = time.monotonic()
                call_command("migrate", "django_pgqueue", verbosity=0)
                migrate_seconds = time.monotonic() - started
                probe.stop.set()
                probe.join(timeout=30)
                connections.close_all()
                new = WorkerProcess(db_url, "--queue", "default", "--concurrency", "4")
                _enqueue(conn, LATER, "during-")
                time.sleep(2)  # both releases side by side for a while
                old.stop()
                assert old.process.returncode is not None
                total = BACKLOG + LATER
                wait_for(
                    lambda: (
                        conn.execute(
                            "SELECT count(*) FROM django_pgqueue_job_all "
                            "WHERE task_path = 'tests.tasks.ledger_sleep' AND status = 'succeeded'"
                        ).fetchone()[0]
                        == total
                    ),
                    timeout=300,
                    message=f"every job to succeed\n{new.output()}",
                )
                wait_for(
                    lambda: (
                        conn.execute(
                            "SELECT count(*) FROM django_pgqueue_job "
                            "WHERE status IN ('succeeded', 'dead_letter', 'cancelled')"
                        ).fetchone()[0]
                        == 0
                    ),
                    timeout=300,
                    message=f"housekeeping to move the old rows\n{new.output()}",
                )
            finally:
                old.stop()
                if new is not None:
                    new.stop()
            assert_logged_no_error(old, new)
        starts = conn.execute(
            "SELECT job_id, count(*) FROM tests_ledgerentry WHERE event = 'start' GROUP BY job_id"
        ).fetchall()
        assert len(starts) == total
        assert {count for _, count in starts} == {1}, "a job ran twice"
        assert len(entries(conn)) == 2 * total
        assert (
            conn.execute(
                "SELECT count(*) FROM django_pgqueue_job_history "
                "WHERE task_path = 'tests.tasks.noop' AND status = 'succeeded'"
            ).fetchone()[0]
            == OLD_FINISHED
        )
        assert conn.execute(
            "SELECT count(*) FROM (SELECT id FROM django_pgqueue_job INTERSECT "
            "SELECT id FROM django_pgqueue_job_history) AS both_tiers"
        ).fetchone() == (0,)
        assert conn.execute(
            "SELECT count(*) FROM django_pgqueue_job_key WHERE idempotency_key LIKE 'old-%%'"
        ).fetchone() == (OLD_FINISHED // 100,)
        assert probe.longest < LONGEST_WAIT_ALLOWED
        with capsys.disabled():
            print(
                f"\nupgrade: {OLD_FINISHED} finished rows moved by housekeeping; migrate "
                f"took {migrate_seconds:.2f}s; longest probe write {probe.longest * 1000:.0f} ms "
                f"over {probe.samples} samples; {total} jobs by the old and new workers, each "
                "run once"
            )
    finally:
        connections.close_all()
        call_command("migrate", "django_pgqueue", verbosity=0)
